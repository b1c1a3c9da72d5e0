// The U-Net of unet_model.h as an extension of a regen that is already loaded: built with
// regen_add_extension (against regen's headers only, no copy of regen inside), it registers
// "unet" into the loader's regen, e.g. the Python module's:
//   import regen
//   regen.load_extension("build-examples/unet_extension.so")   # -> ['unet']
//   regen.Model("unet", batch=8, width=8).train(3, policy="dp", budget="60%")
// examples/python/unet.py runs it under every planner.
#include "unet_model.h"

extern "C" void regen_extension_init() {
  unet::register_unet();
}
