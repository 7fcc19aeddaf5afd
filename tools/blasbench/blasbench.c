// blasbench times OpenBLAS's cblas_sgemm on the shapes keel's float32 GEMM
// benchmark uses, so the two can be compared on the same machine. It prints
// one line per (layout, M, K, N): the best GFLOP/s over several runs.
//
// Layouts: NT = A·Bᵀ, NN = A·B, TN = Aᵀ·B accumulated (beta = 1), all
// row-major, as keel's BenchmarkGemm.
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
	static const int shapes[][3] = {
		{2048, 256, 256}, {2048, 256, 1024}, {2048, 1024, 256}, {512, 512, 512}, {1024, 1024, 1024},
	};
	static const struct { const char *name; int ta, tb; } ops[] = {
		{"NT", 0, 1}, {"NN", 0, 0}, {"TN", 1, 0},
	};
	fprintf(stderr, "OpenBLAS %s, core %s, %d threads\n", openblas_get_config(), openblas_get_corename(), openblas_get_num_threads());
	for (int o = 0; o < 3; o++) {
		for (int s = 0; s < 5; s++) {
			int m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
			float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c = malloc(sizeof(float) * m * n);
			for (int i = 0; i < m * k; i++) a[i] = (float)rand() / RAND_MAX - 0.5f;
			for (int i = 0; i < k * n; i++) b[i] = (float)rand() / RAND_MAX - 0.5f;
			for (int i = 0; i < m * n; i++) c[i] = 0;
			int ta = ops[o].ta, tb = ops[o].tb;
			int lda = ta ? m : k, ldb = tb ? k : n;
			float beta = ta ? 1.0f : 0.0f;
			double flop = 2.0 * m * n * k, best = 0;
			for (int rep = 0; rep < 40; rep++) {
				int iters = 0;
				double t0 = now(), t;
				do {
					cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
						m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
					iters++;
				} while ((t = now() - t0) < 0.02);
				double g = flop * iters / t / 1e9;
				if (g > best) best = g;
			}
			printf("%s %dx%dx%d %.1f\n", ops[o].name, m, k, n, best);
			fflush(stdout);
			free(a); free(b); free(c);
		}
	}
	return 0;
}
