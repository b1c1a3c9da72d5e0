# Real data in CI: sklearn's handwritten digits (Debian's python3-sklearn), converted to the
# CIFAR-10 binary format at test time (tools/digits_data.py: 1297 training images in
# data_batch_1.bin, 500 held out in test_batch.bin), trained with regen's resnet-tiny from the
# weights of tests/data/resnet-tiny_reference.safetensors with warm-up and cosine, then evaluated on
# the held-out split. PyTorch 1.13 (Debian's python3-torch 1.13.1), run once by tools/torch_digits.py
# on the same weights, data, batch order and schedule on 2026-11-27, reached:
TORCH_ACCURACY = 0.9360  # 468 of 500 held-out images
TORCH_CORRECT = 468
TORCH_LOSS = 0.2116
import os
import sys

import pytest

import regen

TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, TOOLS)
from digits_data import write_digits_cifar  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "data", "resnet-tiny_reference.safetensors")
# tools/torch_digits.py's run.
BATCH, STEPS, LR, MOMENTUM, WD, WARMUP = 16, 160, 0.05, 0.9, 5e-4, 10


def test_resnet_tiny_on_digits_reaches_torch_accuracy(tmp_path):
    try:
        import sklearn  # noqa: F401
    except ImportError:
        pytest.fail("the digits test needs python3-sklearn (scripts/install-deps.sh installs it)")
    train, test = write_digits_cifar(str(tmp_path))
    assert (train, test) == (1297, 500)
    m = regen.Model("resnet-tiny", batch=BATCH, device="cpu", image_size=32, num_classes=10,
                    data="cifar10:" + str(tmp_path), lr=LR, momentum=MOMENTUM, weight_decay=WD,
                    lr_schedule="cosine", warmup_steps=WARMUP, schedule_steps=STEPS,
                    eval_batch=100)
    state, _ = regen.load_safetensors(FIXTURE)
    m.load_state_dict({k: v for k, v in state.items() if k in m.state_dict()})
    # tools/digits_data.py's batches() replays regen's CIFAR-10 order for PyTorch's run.
    first = m.step()  # one step of the run
    assert first.lr == pytest.approx(LR / WARMUP)
    rs = m.train(STEPS - 1)
    e = m.evaluate()
    print(f"regen: last training loss {rs[-1].loss:.4f}; held-out accuracy "
          f"{100 * e['accuracy']:.2f}% ({round(e['accuracy'] * 500)} of 500), loss {e['loss']:.4f}; "
          f"PyTorch {100 * TORCH_ACCURACY:.2f}%, {TORCH_LOSS:.4f}")
    assert e["examples"] == 500
    # Within 1 point: 5 of the 500 images, counted (a float difference of 0.01 is not exact).
    assert abs(round(e["accuracy"] * 500) - TORCH_CORRECT) <= 5
    assert abs(e["loss"] - TORCH_LOSS) <= 0.1 * TORCH_LOSS
