/*
 * ps-lite's tests/test_kv_app.cc in C: every worker pushes the same values for a set of keys
 * REPEAT times, then pulls; each pulled value must be REPEAT x num_workers x the pushed one.
 * Pushes use both the wait form and the callback form; pulls write into the caller's buffer,
 * by waiting, by callback, and as a push-pull. The role comes from the environment
 * (DMLC_ROLE and the rest, as ps::launcher sets them).
 *
 * Prints, per worker: "worker rank R: N keys, sum of pulled values S" for the test to check, and
 * exits non-zero on any mismatch.
 */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

#define NUM_KEYS 1000
#define REPEAT 6

static uint64_t keys[NUM_KEYS];
static float vals[NUM_KEYS];

/* Callback completions, counted under a lock the main thread waits on. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int completed = 0;
static int failures = 0;

static void on_done(void *user_data, int64_t request_id, int status) {
    (void)request_id;
    pthread_mutex_lock(&lock);
    if (status != VANS_OK) {
        fprintf(stderr, "request %s failed: %s\n", (const char *)user_data, vans_last_error());
        failures++;
    }
    completed++;
    pthread_cond_signal(&changed);
    pthread_mutex_unlock(&lock);
}

static void wait_for_callbacks(int count) {
    pthread_mutex_lock(&lock);
    while (completed < count) {
        pthread_cond_wait(&changed, &lock);
    }
    pthread_mutex_unlock(&lock);
    EXPECT(failures == 0);
}

/* Checks pulled values against REPEAT x workers x pushed; returns their sum. */
static double check_sums(const float *pulled, uint32_t workers, const char *how) {
    double sum = 0;
    for (int i = 0; i < NUM_KEYS; i++) {
        float expected = vals[i] * (float)(REPEAT * workers);
        if (pulled[i] != expected) {
            fprintf(stderr, "%s: key %llu: pulled %f, expected %f\n", how,
                    (unsigned long long)keys[i], pulled[i], expected);
            exit(4);
        }
        sum += pulled[i];
    }
    return sum;
}

static void run_worker(vans_node *node) {
    uint32_t rank, workers;
    CHECK(vans_node_rank(node, &rank));
    CHECK(vans_node_num_workers(node, &workers));
    vans_worker *worker;
    CHECK(vans_worker_new(node, VANS_F32, 0, 0, &worker));

    /* Keys spread over the whole key space, so that every server gets some. */
    for (int i = 0; i < NUM_KEYS; i++) {
        keys[i] = (UINT64_MAX / NUM_KEYS) * (uint64_t)i + 7;
        vals[i] = (float)(i % 97 + 1);
    }

    /* Half of the pushes wait by request id, half report through a callback. All are in
     * flight at once: the buffer is only read, and nobody writes it until they completed. */
    int64_t ids[REPEAT / 2];
    for (int r = 0; r < REPEAT / 2; r++) {
        CHECK(vans_push(worker, keys, NUM_KEYS, vals, sizeof vals, NULL, 0, NULL, NULL, &ids[r]));
        CHECK(vans_push(worker, keys, NUM_KEYS, vals, sizeof vals, NULL, 0, on_done, "push", NULL));
    }
    for (int r = 0; r < REPEAT / 2; r++) {
        CHECK(vans_wait(worker, ids[r]));
    }
    wait_for_callbacks(REPEAT / 2);

    /* Every worker has pushed everything before anyone pulls. */
    CHECK(vans_node_barrier(node, VANS_WORKER_GROUP));

    /* Pull into the caller's buffer, waiting. */
    static float pulled[NUM_KEYS];
    static int32_t lens[NUM_KEYS];
    int64_t id;
    CHECK(vans_pull(worker, keys, NUM_KEYS, pulled, sizeof pulled, lens, 0, NULL, NULL, &id));
    CHECK(vans_wait(worker, id));
    double sum = check_sums(pulled, workers, "pull");
    for (int i = 0; i < NUM_KEYS; i++) {
        EXPECT(lens[i] == 1);
    }

    /* Pull again, by callback. */
    static float by_callback[NUM_KEYS];
    CHECK(vans_pull(worker, keys, NUM_KEYS, by_callback, sizeof by_callback, NULL, 0, on_done,
                    "pull", NULL));
    wait_for_callbacks(REPEAT / 2 + 1);
    check_sums(by_callback, workers, "pull by callback");

    /* A push-pull of zeros leaves the sums as they are and returns them. */
    static float zeros[NUM_KEYS];
    static float push_pulled[NUM_KEYS];
    CHECK(vans_push_pull(worker, keys, NUM_KEYS, zeros, sizeof zeros, NULL, push_pulled,
                         sizeof push_pulled, NULL, 0, NULL, NULL, &id));
    CHECK(vans_wait(worker, id));
    check_sums(push_pulled, workers, "push-pull");

    printf("worker rank %u: %d keys, sum of pulled values %.0f\n", rank, NUM_KEYS, sum);
    vans_worker_free(worker);
}

int main(void) {
    vans_node *node;
    CHECK(vans_node_start_env(&node));
    int role;
    CHECK(vans_node_role(node, &role));
    vans_server *server = NULL;
    if (role == VANS_ROLE_SERVER) {
        CHECK(vans_server_new_sum(node, VANS_F32, 0, 0, 2, &server));
    } else if (role == VANS_ROLE_WORKER) {
        run_worker(node);
    }
    CHECK(vans_node_finalize(node));
    vans_server_free(server);
    vans_node_free(node);
    return 0;
}
