// Stand-in for <cuda_runtime.h> in the host emulation (scripts/cuda-emu).
#pragma once
#include "emu.h"
