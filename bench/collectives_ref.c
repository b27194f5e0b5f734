/* Reference figures for `trainrun bench collectives`, measured in the same run:
 *   MPICH's own MPI_Allreduce (float32 sum, in place) time and nccl-tests busbw, and
 *   one core's memcpy bandwidth (bytes copied per second) at each size.
 * Run under mpiexec: mpiexec -n 2 collectives_ref FIRST_BYTES LAST_BYTES ITERS WARMUP [STAT]
 * STAT is mean (default: loop time / ITERS, maximum over ranks), median or min (each iteration
 * timed on its own, its maximum over ranks, then the median or minimum), as trainrun's --stat.
 * Prints one line per size on rank 0: bytes mpi_time_us mpi_busbw_GBs memcpy_GBs */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now(void) { return MPI_Wtime(); }

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  long long first = argc > 1 ? atoll(argv[1]) : 4096;
  long long last = argc > 2 ? atoll(argv[2]) : (256ll << 20);
  int iters = argc > 3 ? atoi(argv[3]) : 20;
  int warmup = argc > 4 ? atoi(argv[4]) : 5;
  const char* stat = argc > 5 ? argv[5] : "mean";
  int each = strcmp(stat, "mean") != 0;
  if (iters < 1) iters = 1;
  if (each && strcmp(stat, "median") != 0 && strcmp(stat, "min") != 0) {
    if (rank == 0) fprintf(stderr, "STAT %s: expected mean, median or min\n", stat);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  double* per = malloc(sizeof(double) * iters);
  double* per_worst = malloc(sizeof(double) * iters);
  float* buf = malloc((size_t)last);
  char* src = malloc((size_t)last);
  char* dst = malloc((size_t)last);
  if (!buf || !src || !dst || !per || !per_worst) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
  for (long long i = 0; i < last / 4; ++i) buf[i] = 1.0f;
  memset(src, 1, (size_t)last);
  memset(dst, 0, (size_t)last);
  for (long long bytes = first; bytes <= last; bytes *= 2) {
    int count = (int)(bytes / 4);
    for (int i = 0; i < warmup; ++i) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now(), last = t0, worst;
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (each) { double t = now(); per[i] = t - last; last = t; }
    }
    if (!each) {
      double dt = (now() - t0) / iters;
      MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    } else {
      MPI_Allreduce(per, per_worst, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      qsort(per_worst, (size_t)iters, sizeof(double), by_value);
      worst = strcmp(stat, "min") == 0 ? per_worst[0]
              : iters % 2 ? per_worst[iters / 2]
                          : 0.5 * (per_worst[iters / 2 - 1] + per_worst[iters / 2]);
    }
    /* memcpy on rank 0 alone while the others wait, so it has the core to itself. */
    double copy_gbs = 0;
    if (rank == 0) {
      for (int i = 0; i < warmup; ++i) memcpy(dst, src, (size_t)bytes);
      double c0 = now();
      int reps = 0;
      do { memcpy(dst, src, (size_t)bytes); ++reps; src[reps % bytes] ^= dst[(reps * 7) % bytes]; }
      while (now() - c0 < 0.05 || reps < iters);
      copy_gbs = (double)bytes * reps / (now() - c0) / 1e9;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      double algbw = (double)bytes / worst / 1e9;
      printf("%lld %.1f %.3f %.3f\n", bytes, worst * 1e6, algbw * 2.0 * (n - 1) / n, copy_gbs);
      fflush(stdout);
    }
  }
  free(buf); free(src); free(dst); free(per); free(per_worst);
  MPI_Finalize();
  return 0;
}
