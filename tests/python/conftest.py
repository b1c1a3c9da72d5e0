# pytest setup for the Python tests (ctest runs each test_*.py here with PYTHONPATH at the build's
# python/ folder and REGEN_BINARY at the regen tool; tests/CMakeLists.txt).
import os

import pytest


@pytest.fixture(scope="session")
def regen_binary():
    path = os.environ.get("REGEN_BINARY", "")
    if not path or not os.path.exists(path):
        pytest.fail("REGEN_BINARY must name the regen tool (ctest sets it)")
    return path


# Small configurations whose plans recompute at these budgets (found by planning them): a ResNet
# on 128x128 images, whose activations outweigh its parameters, and the tiny Transformer at 64
# tokens.
RESNET = dict(name="resnet-tiny", batch=8, image_size=128)
TRANSFORMER = dict(name="transformer-tiny", batch=4, seq_len=64)
