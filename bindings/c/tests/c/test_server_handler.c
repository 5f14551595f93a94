/*
 * A server whose requests are answered by a C handler that keeps the maximum of the values
 * pushed for each key instead of their sum, with two shards (one store per shard, indexed by
 * request->shard). Worker r pushes 10 x (r + 1) + i % 7 for key i, several times, then the
 * workers meet at a barrier and each pulls: every key must hold 10 x num_workers + i % 7.
 * A request with command 99 is refused by the handler, and the worker sees its message.
 *
 * Prints "worker rank R: max ok, sum of pulled values S" on each worker.
 */
#include <stdint.h>

#include "check.h"

#define NUM_KEYS 200
#define SHARDS 2
#define SLOTS 1024 /* per shard: a power of two above the keys a shard can get */
#define REFUSED_CMD 99

/* One open-addressing table of key -> max per shard: a shard's calls never overlap, so a
 * shard's table needs no lock. */
struct store {
    uint64_t keys[SLOTS];
    float max[SLOTS];
    int used[SLOTS];
};
static struct store stores[SHARDS];

static float *slot(struct store *store, uint64_t key) {
    size_t at = (size_t)(key * 0x9E3779B97F4A7C15ull >> 40) & (SLOTS - 1);
    while (store->used[at] && store->keys[at] != key) {
        at = (at + 1) & (SLOTS - 1);
    }
    if (!store->used[at]) {
        store->used[at] = 1;
        store->keys[at] = key;
        store->max[at] = -1e30f;
    }
    return &store->max[at];
}

static int max_handler(void *user_data, const vans_request *request, vans_response *response) {
    struct store *shard_stores = user_data;
    if (request->shard >= SHARDS || request->dtype != VANS_F32) {
        vans_response_error(response, "unexpected shard or type");
        return 1;
    }
    if (request->cmd == REFUSED_CMD) {
        vans_response_error(response, "command 99 is refused by the max handler");
        return 1;
    }
    struct store *store = &shard_stores[request->shard];
    if (request->push) {
        const float *vals = request->vals;
        if (request->lens != NULL || request->vals_bytes != request->num_keys * sizeof(float)) {
            vans_response_error(response, "one value per key expected");
            return 1;
        }
        for (size_t i = 0; i < request->num_keys; i++) {
            float *max = slot(store, request->keys[i]);
            if (vals[i] > *max) {
                *max = vals[i];
            }
        }
    }
    if (request->pull) {
        float *out;
        if (vans_response_values(response, request->num_keys * sizeof(float), (void **)&out) !=
            VANS_OK) {
            return 1;
        }
        for (size_t i = 0; i < request->num_keys; i++) {
            out[i] = *slot(store, request->keys[i]);
        }
    }
    return 0;
}

static void run_worker(vans_node *node) {
    uint32_t rank, workers;
    CHECK(vans_node_rank(node, &rank));
    CHECK(vans_node_num_workers(node, &workers));
    vans_worker *worker;
    CHECK(vans_worker_new(node, VANS_F32, 0, 0, &worker));
    static uint64_t keys[NUM_KEYS];
    static float vals[NUM_KEYS];
    for (int i = 0; i < NUM_KEYS; i++) {
        keys[i] = (UINT64_MAX / NUM_KEYS) * (uint64_t)i + 1;
        vals[i] = (float)(10 * (rank + 1) + (uint32_t)i % 7);
    }
    for (int r = 0; r < 3; r++) {
        int64_t id;
        CHECK(vans_push(worker, keys, NUM_KEYS, vals, sizeof vals, NULL, 0, NULL, NULL, &id));
        CHECK(vans_wait(worker, id));
    }
    CHECK(vans_node_barrier(node, VANS_WORKER_GROUP));

    static float pulled[NUM_KEYS];
    int64_t id;
    CHECK(vans_pull(worker, keys, NUM_KEYS, pulled, sizeof pulled, NULL, 0, NULL, NULL, &id));
    CHECK(vans_wait(worker, id));
    double sum = 0;
    for (int i = 0; i < NUM_KEYS; i++) {
        float expected = (float)(10 * workers + (uint32_t)i % 7);
        if (pulled[i] != expected) {
            fprintf(stderr, "key %d: pulled %f, expected %f\n", i, pulled[i], expected);
            exit(4);
        }
        sum += pulled[i];
    }

    /* The handler refuses command 99: the worker gets its message. */
    CHECK(vans_push(worker, keys, NUM_KEYS, vals, sizeof vals, NULL, REFUSED_CMD, NULL, NULL,
                    &id));
    EXPECT_ERROR(vans_wait(worker, id), VANS_ERR_HANDLER_FAILED,
                 "command 99 is refused by the max handler");

    printf("worker rank %u: max ok, sum of pulled values %.0f\n", rank, sum);
    vans_worker_free(worker);
}

int main(void) {
    vans_node *node;
    CHECK(vans_node_start_env(&node));
    int role;
    CHECK(vans_node_role(node, &role));
    vans_server *server = NULL;
    if (role == VANS_ROLE_SERVER) {
        EXPECT_ERROR(vans_server_new(node, VANS_F32, 0, 0, SHARDS, NULL, stores, &server),
                     VANS_ERR_INVALID_ARGUMENT, "handler is NULL");
        CHECK(vans_server_new(node, VANS_F32, 0, 0, SHARDS, max_handler, stores, &server));
    } else if (role == VANS_ROLE_WORKER) {
        run_worker(node);
    }
    CHECK(vans_node_finalize(node));
    vans_server_free(server);
    vans_node_free(node);
    return 0;
}
