// Prints the losses of llm.c's CPU GPT-2 trainer (its train_gpt2.c, compiled in from an llm.c
// checkout; nothing of it is copied here) for a checkpoint and a token shard that regen wrote, so
// that regen's losses can be set beside them (docs/models.md, "Parity with llm.c"). Step s trains
// on tokens [s B T, (s + 1) B T + 1) of the shard, the batches regen's `--data tokens:FILE` makes,
// with llm.c's AdamW (betas 0.9 and 0.999, eps 1e-8; its CPU trainer decays every parameter).
// Build: cc -O2 -fopenmp -I LLMC_DIR tools/llmc_losses.c -lm -o llmc_losses (no -Ofast: regen
// does not reassociate float arithmetic either). For llm.c's speed, build it as llm.c's own
// Makefile builds train_gpt2: -Ofast -march=native -fopenmp (OMP_NUM_THREADS sets the threads).
// Run:   llmc_losses CHECKPOINT.bin TOKENS.bin B T STEPS LR [WEIGHT_DECAY]
// Each step prints its loss and its wall time (forward, zero_grad, backward, update: what
// train_gpt2.c's own loop times).
#define main llmc_train_main
#include "train_gpt2.c"
#undef main

int main(int argc, char** argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: %s CHECKPOINT.bin TOKENS.bin B T STEPS LR [WEIGHT_DECAY]\n", argv[0]);
    return 1;
  }
  GPT2 model;
  gpt2_build_from_checkpoint(&model, argv[1]);
  FILE* f = fopen(argv[2], "rb");
  if (f == NULL) {
    fprintf(stderr, "cannot open %s\n", argv[2]);
    return 1;
  }
  int header[256];
  if (fread(header, sizeof(int), 256, f) != 256 || header[0] != 20240520 || header[1] != 1) {
    fprintf(stderr, "%s: not an llm.c token shard\n", argv[2]);
    return 1;
  }
  const size_t count = (size_t)header[2];
  uint16_t* tokens = (uint16_t*)malloc(count * sizeof(uint16_t));
  if (fread(tokens, sizeof(uint16_t), count, f) != count) {
    fprintf(stderr, "%s: truncated\n", argv[2]);
    return 1;
  }
  fclose(f);
  const int B = atoi(argv[3]), T = atoi(argv[4]), steps = atoi(argv[5]);
  const float lr = (float)atof(argv[6]), weight_decay = argc > 7 ? (float)atof(argv[7]) : 0.0f;
  if ((size_t)steps * B * T + 1 > count) {
    fprintf(stderr, "%s: %zu tokens, fewer than %d steps of %d x %d need\n", argv[2], count, steps,
            B, T);
    return 1;
  }
  int* inputs = (int*)malloc((size_t)B * T * sizeof(int));
  int* targets = (int*)malloc((size_t)B * T * sizeof(int));
  for (int s = 0; s < steps; s++) {
    const size_t at = (size_t)s * B * T;
    for (int i = 0; i < B * T; i++) {
      inputs[i] = tokens[at + i];
      targets[i] = tokens[at + i + 1];
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gpt2_forward(&model, inputs, targets, B, T);
    const float loss = model.mean_loss;
    gpt2_zero_grad(&model);
    gpt2_backward(&model);
    gpt2_update(&model, lr, 0.9f, 0.999f, 1e-8f, weight_decay, s + 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("step %d loss %.9g time_ms %.1f\n", s, loss, ms);
    fflush(stdout);
  }
  gpt2_free(&model);
  free(tokens);
  free(inputs);
  free(targets);
  return 0;
}
