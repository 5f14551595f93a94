/*
 * Collectives from C among the workers of a cluster: every worker all-reduces arrays of
 * each element type in place (a length no rank count divides), broadcasts from the last
 * rank and meets the others at a barrier; every result is checked exactly. Bad calls are
 * errors naming the problem.
 *
 * Prints "collective ok: rank R of N" on each worker.
 */
#include <stdint.h>

#include "check.h"

#define LEN 10007

int main(void) {
    vans_node *node;
    CHECK(vans_node_start_env(&node));
    int role;
    CHECK(vans_node_role(node, &role));
    if (role == VANS_ROLE_WORKER) {
        vans_collective *comm;
        CHECK(vans_collective_start(node, &comm));
        int rank, size;
        CHECK(vans_collective_rank(comm, &rank, &size));
        EXPECT(rank >= 0 && rank < size);

        static int64_t a[LEN];
        for (int i = 0; i < LEN; i++) a[i] = (int64_t)rank * 100000 + i;
        CHECK(vans_allreduce(comm, VANS_I64, a, LEN, VANS_OP_SUM));
        int64_t ranks = (int64_t)size * (size - 1) / 2;
        for (int i = 0; i < LEN; i++) EXPECT(a[i] == ranks * 100000 + (int64_t)size * i);

        double d[33];
        for (int i = 0; i < 33; i++) d[i] = rank;
        CHECK(vans_allreduce(comm, VANS_F64, d, 33, VANS_OP_MEAN));
        for (int i = 0; i < 33; i++) EXPECT(d[i] == (double)ranks / size);

        float f[5];
        for (int i = 0; i < 5; i++) f[i] = (float)(rank * i);
        CHECK(vans_allreduce(comm, VANS_F32, f, 5, VANS_OP_MAX));
        for (int i = 0; i < 5; i++) EXPECT(f[i] == (float)((size - 1) * i));

        int32_t m[3] = {rank, rank + 1, rank + 2};
        CHECK(vans_allreduce(comm, VANS_I32, m, 3, VANS_OP_MIN));
        EXPECT(m[0] == 0 && m[1] == 1 && m[2] == 2);

        CHECK(vans_allreduce(comm, VANS_F32, NULL, 0, VANS_OP_SUM));

        int32_t b[100];
        for (int i = 0; i < 100; i++) b[i] = rank == size - 1 ? i * 3 : -1;
        CHECK(vans_broadcast(comm, VANS_I32, b, 100, size - 1));
        for (int i = 0; i < 100; i++) EXPECT(b[i] == i * 3);

        EXPECT_ERROR(vans_allreduce(comm, VANS_U8, b, 4, VANS_OP_SUM), VANS_ERR_INVALID_ARGUMENT,
                     "VANS_F32, VANS_F64, VANS_I32 or VANS_I64");
        EXPECT_ERROR(vans_allreduce(comm, VANS_I32, b, 4, 7), VANS_ERR_INVALID_ARGUMENT,
                     "reduction 7");
        EXPECT_ERROR(vans_broadcast(comm, VANS_I32, b, 4, size), VANS_ERR_INVALID_ARGUMENT,
                     "broadcast from rank");
        EXPECT_ERROR(vans_allreduce(comm, VANS_I32, NULL, 4, VANS_OP_SUM),
                     VANS_ERR_INVALID_ARGUMENT, "data is NULL");

        CHECK(vans_collective_barrier(comm));
        CHECK(vans_collective_settle(comm, 1000, &rank, &size));
        printf("collective ok: rank %d of %d\n", rank, size);
        fflush(stdout);
        vans_collective_free(comm);
    }
    CHECK(vans_node_finalize(node));
    vans_node_free(node);
    return 0;
}
