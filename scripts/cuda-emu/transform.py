# Rewrites a .cu file for the host emulation (scripts/cuda-emu): kernel launches
# `kernel<<<grid, block, smem, stream>>>(args)` become `::emu::launch(kernel, ::emu::Cfg(...), args)`,
# and `extern __shared__` buffers become the emulator's per-block dynamic shared memory.
import re, sys, os
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
s = re.sub(r'extern __shared__ __align__\(16\) float smem\[\];', 'float* smem = ::emu::dynamic_smem();', s)
pat = re.compile(r'([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)
s, n = pat.subn(lambda m: f'::emu::launch({m.group(1)}, ::emu::Cfg({m.group(2)}), ', s)
out = '#include "emu.h"\n' + s
# Unchanged output keeps its time stamp, so run.sh does not recompile the file.
if not os.path.exists(dst) or open(dst).read() != out:
    open(dst, 'w').write(out)
print(dst, n, 'launches')
