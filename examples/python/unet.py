"""The U-Net of examples/unet from Python, two ways, with one copy of regen in the process.

1. The C++ U-Net (examples/unet/unet_model.h), loaded as an extension: unet_extension.so is built
   against regen's headers only (regen_add_extension), so regen.load_extension binds it to this
   module's regen, and regen.Model("unet", ...) builds it like a built-in model.
2. The same network written here from regen.ops (concat, upsample2x, conv_transpose2d, max_pool2d,
   permute) and registered as "py-unet", taking the U-Net's input (images and a class per pixel).

Both are profiled, planned with every registered planner at a budget and trained under each plan:
each plan must fit and recompute, every step's measured peaks must equal the plan's predicted ones
to the byte, and the training
must be bitwise that of no remat. The Python U-Net must train bitwise as the C++ one does. Exits 1
when a check fails.

    PYTHONPATH=build/python python3 examples/python/unet.py build/examples/unet_extension.so [--quick]
"""
import argparse
import sys

import numpy as np

import regen
from regen import ops


def build_unet(net, config):
    """The U-Net of unet_model.h from Python: the same layers, made in the same order from the
    model's seed (so the same weights), and the same ops."""
    levels, width = config["levels"], config["width"]

    def double_conv(name, cin, cout):
        conv1 = net.conv2d(f"{name}.conv1", cin, cout, 3, padding=1)
        bn1 = net.batch_norm2d(f"{name}.bn1", cout)
        conv2 = net.conv2d(f"{name}.conv2", cout, cout, 3, padding=1)
        bn2 = net.batch_norm2d(f"{name}.bn2", cout)

        def forward(x):
            with regen.scope(name), regen.block():  # one block for the planners
                return ops.relu(bn2(conv2(ops.relu(bn1(conv1(x))))))
        return forward

    down, cin = [], 3
    for i in range(levels):
        down.append(double_conv(f"down{i}", cin, width << i))
        cin = width << i
    bottom = double_conv("bottom", cin, width << levels)
    up_weight = net.parameter("up.weight", [width << levels, width << (levels - 1), 2, 2], std=0.1)
    up_bias = net.parameter("up.bias", [width << (levels - 1)])
    up, cur = [None] * levels, width << (levels - 1)
    for i in reversed(range(levels)):
        up[i] = double_conv(f"up{i}", cur + (width << i), width << i)
        cur = width << i
    head = net.conv2d("head", cur, config["num_classes"], 1, bias=True)

    class UNet:
        def forward(self, x):
            skips = []
            for i in range(levels):
                x = down[i](x)
                skips.append(x)  # the long skips
                with regen.scope(f"pool{i}"):
                    x = ops.max_pool2d(x, 2)
            x = bottom(x)
            for i in reversed(range(levels)):
                with regen.scope(f"up{i}_sample"):
                    if i == levels - 1:
                        x = ops.conv_transpose2d(x, up_weight(), up_bias(), stride=2)
                    else:
                        x = ops.upsample2x(x, "bilinear" if i == levels - 2 else "nearest")
                    x = ops.concat([x, skips[i]], 1)
                x = up[i](x)
            return head(x)

        def loss(self, scores, target):  # cross-entropy over every pixel
            with regen.scope("loss"):
                per_pixel = ops.reshape(ops.permute(scores, [0, 2, 3, 1]), [-1, scores.shape[1]])
                return ops.cross_entropy(per_pixel, ops.reshape(target, [-1]))

    return UNet()


def train(name, steps, plan=None, **kw):
    m = regen.Model(name, **kw)
    results = m.train(steps, plan=plan) if plan else m.train(steps)
    state = m.state_dict()
    return [r.loss for r in results], state, results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("extension", help="unet_extension.so (examples/, regen_add_extension)")
    parser.add_argument("--quick", action="store_true", help="a small U-Net, two planners")
    args = parser.parse_args()

    assert regen.load_extension(args.extension) == ["unet"]
    regen.register_model("py-unet", build_unet, input="unet",
                         help="the U-Net of examples/unet from regen.ops")
    kw = dict(batch=4, device="cpu", image_size=32, width=4, seed=7, lr=0.05)
    if args.quick:
        kw.update(levels=3)
    steps = 3
    failures = 0

    # The same network from C++ and from Python: bitwise the same training.
    ref_losses, ref_state, ref_results = train("unet", steps, **kw)
    py_losses, py_state, py_results = train("py-unet", steps, **kw)
    same = py_losses == ref_losses and all(np.array_equal(py_state[k], v)
                                          for k, v in ref_state.items())
    peaks = [(r.peak_allocated, r.peak_reserved) for r in ref_results]
    same_peaks = peaks == [(r.peak_allocated, r.peak_reserved) for r in py_results]
    print(f"unet (C++ extension) and py-unet (regen.ops): losses {ref_losses[0]:.4f} -> "
          f"{ref_losses[-1]:.4f}, training {'bitwise the same' if same else 'DIFFERS'}, "
          f"peaks {'the same' if same_peaks else 'DIFFER'}")
    failures += (not same) + (not same_peaks)

    policies = ["blocks", "mutwo", "dp"] if args.quick else [
        p for p in regen.policies() if p not in ("none", "milp")]
    for name in ("unet", "py-unet"):
        profile = regen.profile(name, iterations=1, **kw)
        for policy in policies:
            # Halfway between the lowest peak the planner reaches and no remat: a budget it can
            # meet that needs recomputation.
            probe = regen.plan(profile, policy, 1, budget_of="allocated")
            budget = (probe.lowest_peak + probe.no_remat_peak) // 2
            plan = regen.plan(profile, policy, budget, budget_of="allocated")
            losses, state, results = train(name, steps, plan=plan, **kw)
            exact = all((r.peak_allocated, r.peak_reserved) == (plan.peak_allocated,
                                                               plan.peak_reserved) for r in results)
            bitwise = losses == ref_losses and all(np.array_equal(state[k], v)
                                                   for k, v in ref_state.items())
            print(f"  {name:8s} {policy:7s} fits {'yes' if plan.feasible else 'no ':3s} "
                  f"recomputes {plan.recomputed:3d}: peak {plan.peak_allocated} predicted, "
                  f"{results[-1].peak_allocated} measured ({'exact' if exact else 'DIFFERS'}), "
                  f"training {'bitwise' if bitwise else 'DIFFERS'}")
            failures += (not exact) + (not bitwise) + (not plan.feasible) + (plan.recomputed == 0)
    if failures:
        print(f"unet.py: {failures} check(s) failed")
        return 1
    print("unet.py: every plan exact and bitwise, the Python U-Net the same as the C++ one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
