"""PyTorch twins of regen's built-in models, with the same parameter names and shapes:
ResNet (torchvision's layout; basic or bottleneck blocks, any base width) and the Transformer
language model (token + learned position embeddings, post-norm encoder layers, causal mask,
linear head). Used by tools/make_reference.py and tools/torch_baseline.py."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


RESNETS = {
    "resnet18": ([2, 2, 2, 2], False), "resnet34": ([3, 4, 6, 3], False),
    "resnet50": ([3, 4, 6, 3], True), "resnet101": ([3, 4, 23, 3], True),
    "resnet152": ([3, 8, 36, 3], True),
}


class ResNet(nn.Module):
    def __init__(self, blocks, width=64, num_classes=1000, bottleneck=True):
        super().__init__()
        block = Bottleneck if bottleneck else BasicBlock
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = width
        for i, n in enumerate(blocks):
            planes = width << i
            layer = []
            for b in range(n):
                layer.append(block(inplanes, planes, 2 if (b == 0 and i > 0) else 1))
                inplanes = planes * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        self.checkpoint_blocks = False
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        for i in range(4):
            for blk in getattr(self, f"layer{i + 1}"):
                x = ckpt.checkpoint(blk, x, use_reentrant=False) if self.checkpoint_blocks else blk(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class TransformerLM(nn.Module):
    def __init__(self, vocab=30000, seq=128, d=512, layers=6, heads=8, ff=2048, dropout=0.1):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.lm_head = nn.Linear(d, vocab)
        self.checkpoint_blocks = False

    def forward(self, tokens):
        s = tokens.shape[1]
        h = self.drop(self.tok_emb(tokens) + self.pos_emb(torch.arange(s, device=tokens.device)))
        mask = torch.triu(torch.full((s, s), float("-inf"), device=tokens.device), diagonal=1)
        for layer in self.encoder.layers:
            if self.checkpoint_blocks:
                h = ckpt.checkpoint(layer, h, mask, use_reentrant=False)
            else:
                h = layer(h, src_mask=mask)
        return self.lm_head(h)


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
