/*
 * Embedding tables with server-side optimizers from C: every server holds one table per
 * optimizer (apps 0-5: SGD, momentum, Nesterov momentum, Adagrad, Adam, FTRL) of DIM floats
 * per key, rows starting at zero. Each step, every worker pushes its gradients with
 * VANS_ACCUMULATE_CMD, the workers meet at a barrier, each pulls with VANS_APPLY_CMD (the
 * first apply steps every row once with the sum, a later one finds nothing pending), and they
 * meet again. The pulled rows must match each optimizer's formulas computed here in double
 * precision. A bad spec is refused with its reason.
 *
 * Prints "worker rank R: tables ok, sum of pulled values S" on each worker.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"

#define NUM_KEYS 64
#define DIM 8
#define STEPS 4
#define SHARDS 2

#define TABLES 6

static const char *SPECS[TABLES] = {
    "optimizer=sgd dim=8 lr=0.1 init=zeros",
    "optimizer=momentum dim=8 lr=0.05 momentum=0.9 init=zeros",
    "optimizer=momentum, dim=8, lr=0.05, momentum=0.8, nesterov=true, init=zeros",
    "optimizer=adagrad dim=8 lr=0.5 initial_accumulator=0.1 eps=1e-10 init=zeros",
    "optimizer=adam, dim=8, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, init=zeros",
    "optimizer=ftrl dim=8 lr=0.5 beta=1 l1=0.05 l2=0.01 init=zeros",
};
static const char *NAMES[TABLES] = {"sgd", "momentum", "nesterov", "adagrad", "adam", "ftrl"};

/* Worker `rank`'s gradient at `step` for value `j` of key `i`. */
static double gradient(uint32_t rank, int step, int i, int j) {
    return (double)((rank * 3 + (uint32_t)step * 5 + (uint32_t)i + (uint32_t)j) % 7) / 4.0 -
           0.75;
}

/* The rows every table should hold after STEPS steps of `workers` summed gradients. */
static void reference(uint32_t workers, double want[TABLES][NUM_KEYS * DIM]) {
    static double a[TABLES][NUM_KEYS * DIM], b[TABLES][NUM_KEYS * DIM];
    for (int t = 0; t < TABLES; t++) {
        for (int k = 0; k < NUM_KEYS * DIM; k++) {
            want[t][k] = a[t][k] = b[t][k] = 0;
        }
    }
    for (int k = 0; k < NUM_KEYS * DIM; k++) {
        a[3][k] = 0.1; /* Adagrad's initial accumulator */
    }
    for (int step = 0; step < STEPS; step++) {
        double bias1 = 1 - pow(0.9, step + 1), bias2 = 1 - pow(0.999, step + 1);
        for (int i = 0; i < NUM_KEYS; i++) {
            for (int j = 0; j < DIM; j++) {
                int k = i * DIM + j;
                double g = 0;
                for (uint32_t r = 0; r < workers; r++) {
                    g += gradient(r, step, i, j);
                }
                want[0][k] -= 0.1 * g;
                /* torch.optim.SGD with momentum: the buffer starts as the first gradient. */
                a[1][k] = step == 0 ? g : 0.9 * a[1][k] + g;
                want[1][k] -= 0.05 * a[1][k];
                a[2][k] = step == 0 ? g : 0.8 * a[2][k] + g;
                want[2][k] -= 0.05 * (g + 0.8 * a[2][k]);
                a[3][k] += g * g;
                want[3][k] -= 0.5 * g / (sqrt(a[3][k]) + 1e-10);
                a[4][k] = 0.9 * a[4][k] + 0.1 * g;
                b[4][k] = 0.999 * b[4][k] + 0.001 * g * g;
                want[4][k] -= 0.01 * (a[4][k] / bias1) / (sqrt(b[4][k] / bias2) + 1e-8);
                /* FTRL-Proximal: z in a, n in b. */
                double sigma = (sqrt(b[5][k] + g * g) - sqrt(b[5][k])) / 0.5;
                a[5][k] += g - sigma * want[5][k];
                b[5][k] += g * g;
                want[5][k] = fabs(a[5][k]) <= 0.05
                                 ? 0.0
                                 : -(a[5][k] - (a[5][k] > 0 ? 0.05 : -0.05)) /
                                       ((1.0 + sqrt(b[5][k])) / 0.5 + 0.01);
            }
        }
    }
}

static void expect_close(const char *table, const float *got, const double *want) {
    for (int k = 0; k < NUM_KEYS * DIM; k++) {
        if (fabs(got[k] - want[k]) > 1e-5 + 1e-4 * fabs(want[k])) {
            fprintf(stderr, "%s: value %d of key %d is %.7f, expected %.7f\n", table, k % DIM,
                    k / DIM, got[k], want[k]);
            exit(4);
        }
    }
}

static void run_worker(vans_node *node) {
    uint32_t rank, workers;
    CHECK(vans_node_rank(node, &rank));
    CHECK(vans_node_num_workers(node, &workers));
    vans_worker *tables[TABLES];
    for (int t = 0; t < TABLES; t++) {
        CHECK(vans_worker_new(node, VANS_F32, t, 0, &tables[t]));
    }
    static uint64_t keys[NUM_KEYS];
    static float grads[NUM_KEYS * DIM];
    static float pulled[TABLES][NUM_KEYS * DIM];
    for (int i = 0; i < NUM_KEYS; i++) {
        keys[i] = (UINT64_MAX / NUM_KEYS) * (uint64_t)i + 7; /* every server, every shard */
    }
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < NUM_KEYS; i++) {
            for (int j = 0; j < DIM; j++) {
                grads[i * DIM + j] = (float)gradient(rank, step, i, j);
            }
        }
        int64_t ids[TABLES];
        for (int t = 0; t < TABLES; t++) {
            CHECK(vans_push(tables[t], keys, NUM_KEYS, grads, sizeof grads, NULL,
                            VANS_ACCUMULATE_CMD, NULL, NULL, &ids[t]));
        }
        for (int t = 0; t < TABLES; t++) {
            CHECK(vans_wait(tables[t], ids[t]));
        }
        CHECK(vans_node_barrier(node, VANS_WORKER_GROUP));
        for (int t = 0; t < TABLES; t++) {
            CHECK(vans_pull(tables[t], keys, NUM_KEYS, pulled[t], sizeof pulled[t], NULL,
                            VANS_APPLY_CMD, NULL, NULL, &ids[t]));
            CHECK(vans_wait(tables[t], ids[t]));
        }
        CHECK(vans_node_barrier(node, VANS_WORKER_GROUP));
    }
    static double want[TABLES][NUM_KEYS * DIM];
    reference(workers, want);
    double sum = 0;
    for (int t = 0; t < TABLES; t++) {
        int64_t id;
        CHECK(vans_pull(tables[t], keys, NUM_KEYS, pulled[t], sizeof pulled[t], NULL, 0, NULL,
                        NULL, &id));
        CHECK(vans_wait(tables[t], id));
        for (int k = 0; k < NUM_KEYS * DIM; k++) {
            sum += pulled[t][k];
        }
        expect_close(NAMES[t], pulled[t], want[t]);
    }

    /* A push of the wrong width: the server refuses it, naming the table's dim. */
    int64_t id;
    CHECK(vans_push(tables[0], keys, NUM_KEYS, grads, NUM_KEYS * sizeof(float), NULL, 0, NULL,
                    NULL, &id));
    EXPECT_ERROR(vans_wait(tables[0], id), VANS_ERR_HANDLER_FAILED, "table with dim 8");

    printf("worker rank %u: tables ok, sum of pulled values %.6f\n", rank, sum);
    for (int t = 0; t < TABLES; t++) {
        vans_worker_free(tables[t]);
    }
}

int main(void) {
    vans_node *node;
    CHECK(vans_node_start_env(&node));
    int role;
    CHECK(vans_node_role(node, &role));
    vans_server *servers[TABLES] = {NULL};
    if (role == VANS_ROLE_SERVER) {
        EXPECT_ERROR(vans_server_new_table(node, "optimizer=adamw dim=8", 0, 0, 1, &servers[0]),
                     VANS_ERR_INVALID_ARGUMENT, "unknown optimizer \"adamw\"");
        EXPECT_ERROR(vans_server_new_table(node, "optimizer=sgd dim=8 beta1=0.9", 0, 0, 1,
                                           &servers[0]),
                     VANS_ERR_INVALID_ARGUMENT, "beta1 is not a setting of optimizer sgd");
        EXPECT_ERROR(vans_server_new_table(node, NULL, 0, 0, 1, &servers[0]),
                     VANS_ERR_INVALID_ARGUMENT, "spec is NULL");
        for (int t = 0; t < TABLES; t++) {
            CHECK(vans_server_new_table(node, SPECS[t], t, 0, SHARDS, &servers[t]));
        }
    } else if (role == VANS_ROLE_WORKER) {
        run_worker(node);
    }
    CHECK(vans_node_finalize(node));
    for (int t = 0; t < TABLES; t++) {
        vans_server_free(servers[t]);
    }
    vans_node_free(node);
    return 0;
}
