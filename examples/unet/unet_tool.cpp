// regen's command line with the U-Net registered: every subcommand works on it through the same
// code as on the built-in models, e.g.
//   unet-tool train --model unet --batch 16 --policy dp --budget 60% --budget-of allocated
//   unet-tool sweep --model unet --batches 8,16 --policies blocks,mutwo,dp --budgets 70%,lowest
#include "regen/tools/cli.h"
#include "unet_model.h"

int main(int argc, char** argv) {
  unet::register_unet();
  return regen::tool::run_cli(argc, argv);
}
