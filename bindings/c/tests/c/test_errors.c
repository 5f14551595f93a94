/*
 * The error paths of the C ABI: NULL handles and pointers, bad lengths, unknown settings,
 * wrong output sizes, unsorted and repeated keys, keys no one pushed, unknown request ids
 * and a blocking wait inside a callback are all status codes with messages, never crashes. The node starts from an
 * explicit vans_config (copied from the DMLC_* variables the launcher set), not from the
 * environment.
 *
 * Prints "errors ok" on the worker.
 */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

/* Things that need no cluster. */
static void without_a_node(void) {
    uint32_t rank = 0;
    EXPECT_ERROR(vans_node_rank(NULL, &rank), VANS_ERR_INVALID_ARGUMENT, "node is NULL");
    EXPECT_ERROR(vans_node_start_env(NULL), VANS_ERR_INVALID_ARGUMENT, "out is NULL");
    uint64_t key = 1;
    float value = 1;
    int64_t id;
    EXPECT_ERROR(vans_push(NULL, &key, 1, &value, sizeof value, NULL, 0, NULL, NULL, &id),
                 VANS_ERR_INVALID_ARGUMENT, "worker is NULL");
    EXPECT_ERROR(vans_wait(NULL, 1), VANS_ERR_INVALID_ARGUMENT, "worker is NULL");
    EXPECT_ERROR(vans_rendezvous_cleanup(NULL, 1), VANS_ERR_INVALID_ARGUMENT,
                 "rendezvous is NULL");
    EXPECT_ERROR(vans_rendezvous_pin(NULL, 1), VANS_ERR_INVALID_ARGUMENT, "rendezvous is NULL");
    EXPECT(vans_buffer_len(NULL) == 0);
    EXPECT(vans_buffer_data(NULL) == NULL);
    size_t header_len = 1;
    EXPECT(vans_buffer_header(NULL, &header_len) != NULL && header_len == 0);
    vans_node_free(NULL);
    vans_worker_free(NULL);
    vans_buffer_free(NULL);

    EXPECT(strcmp(vans_status_name(VANS_ERR_TIMEOUT), "VANS_ERR_TIMEOUT") == 0);
    EXPECT(strcmp(vans_status_name(12345), "VANS_ERR_UNKNOWN_STATUS") == 0);
    EXPECT(strlen(vans_version()) > 0);

    vans_config *config;
    CHECK(vans_config_new(&config));
    EXPECT_ERROR(vans_config_set(config, "DMLC_NO_SUCH_THING", "1"), VANS_ERR_INVALID_ARGUMENT,
                 "DMLC_NO_SUCH_THING");
    EXPECT_ERROR(vans_config_set(config, NULL, "1"), VANS_ERR_INVALID_ARGUMENT, "name is NULL");
    CHECK(vans_config_set(config, "DMLC_NUM_WORKER", "many"));
    vans_node *node = NULL;
    EXPECT_ERROR(vans_node_start(config, &node), VANS_ERR_CONFIG, "DMLC_NUM_WORKER");
    EXPECT(node == NULL);
    vans_config_free(config);
}

/* A callback that tries to wait: refused, because it runs on an I/O thread. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int inner_status = 1;
static char inner_message[512];

static void waits_inside(void *user_data, int64_t request_id, int status) {
    (void)status;
    int waited = vans_wait((const vans_worker *)user_data, request_id);
    pthread_mutex_lock(&lock);
    snprintf(inner_message, sizeof inner_message, "%s", vans_last_error());
    inner_status = waited;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static void run_worker(vans_node *node) {
    vans_worker *worker;
    EXPECT_ERROR(vans_worker_new(node, 0, 0, 0, &worker), VANS_ERR_INVALID_ARGUMENT,
                 "value type 0");
    CHECK(vans_worker_new(node, VANS_F32, 0, 0, &worker));

    uint64_t keys[4] = {1, 2, 3, UINT64_MAX - 1};
    float vals[4] = {1, 2, 3, 4};
    int64_t id;
    CHECK(vans_push(worker, keys, 4, vals, sizeof vals, NULL, 0, NULL, NULL, &id));
    CHECK(vans_wait(worker, id));
    EXPECT_ERROR(vans_wait(worker, id), VANS_ERR_UNKNOWN_REQUEST, "already waited for");
    EXPECT_ERROR(vans_wait(worker, 987654), VANS_ERR_UNKNOWN_REQUEST, "987654");

    /* Pull into a buffer that is too small: both sizes named, the buffer untouched. */
    float small[3] = {-1, -1, -1};
    CHECK(vans_pull(worker, keys, 4, small, sizeof small, NULL, 0, NULL, NULL, &id));
    EXPECT_ERROR(vans_wait(worker, id), VANS_ERR_INVALID_ARGUMENT,
                 "the output buffer holds 12 bytes but 16 bytes of values arrived");
    EXPECT(small[0] == -1 && small[2] == -1);

    /* Lengths and pointers that cannot be right. */
    EXPECT_ERROR(vans_push(worker, keys, 4, vals, 7, NULL, 0, NULL, NULL, &id),
                 VANS_ERR_INVALID_ARGUMENT, "vals_bytes 7 is not a multiple of the value size 4");
    EXPECT_ERROR(vans_push(worker, NULL, 4, vals, sizeof vals, NULL, 0, NULL, NULL, &id),
                 VANS_ERR_INVALID_ARGUMENT, "keys is NULL but num_keys is 4");
    EXPECT_ERROR(vans_push(worker, keys, 4, NULL, 16, NULL, 0, NULL, NULL, &id),
                 VANS_ERR_INVALID_ARGUMENT, "vals is NULL but its length is 16");
    EXPECT_ERROR(vans_push(worker, keys, 4, vals, sizeof vals, NULL, 0, NULL, NULL, NULL),
                 VANS_ERR_INVALID_ARGUMENT, "request_id");
    EXPECT_ERROR(vans_pull(worker, keys, 4, NULL, 16, NULL, 0, NULL, NULL, &id),
                 VANS_ERR_INVALID_ARGUMENT, "vals is NULL");
    EXPECT_ERROR(vans_pull(worker, keys, 4, small, 6, NULL, 0, NULL, NULL, &id),
                 VANS_ERR_INVALID_ARGUMENT, "does not hold whole values");

    /* Unsorted keys are refused when the request is made or when it is waited for. */
    uint64_t unsorted[2] = {5, 1};
    int status = vans_push(worker, unsorted, 2, vals, 8, NULL, 0, NULL, NULL, &id);
    if (status == VANS_OK) {
        status = vans_wait(worker, id);
    }
    EXPECT(status == VANS_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(vans_last_error(), "sorted") != NULL);

    /* A repeated key is refused by name: it would be summed twice. */
    uint64_t twice[2] = {7, 7};
    status = vans_push(worker, twice, 2, vals, 8, NULL, 0, NULL, NULL, &id);
    if (status == VANS_OK) {
        status = vans_wait(worker, id);
    }
    EXPECT(status == VANS_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(vans_last_error(), "key 7 is given twice") != NULL);

    /* A key no one pushed: zeros in its place when the buffer says how many values each
     * key has (no lens), an error naming it when it cannot (lens wanted back). Never fewer
     * values than keys. */
    uint64_t some_unpushed[3] = {1, 5000, UINT64_MAX - 1};
    float zeros_in_place[3] = {-1, -1, -1};
    CHECK(vans_pull(worker, some_unpushed, 3, zeros_in_place, sizeof zeros_in_place, NULL, 0,
                    NULL, NULL, &id));
    CHECK(vans_wait(worker, id));
    EXPECT(zeros_in_place[0] == 1 && zeros_in_place[1] == 0 && zeros_in_place[2] == 4);
    int32_t got_lens[3];
    CHECK(vans_pull(worker, some_unpushed, 3, zeros_in_place, sizeof zeros_in_place, got_lens,
                    0, NULL, NULL, &id));
    EXPECT_ERROR(vans_wait(worker, id), VANS_ERR_HANDLER_FAILED, "key 5000 was never pushed");

    /* Lengths that do not cover the values. */
    int32_t lens[4] = {1, 1, 1, 2};
    status = vans_push(worker, keys, 4, vals, sizeof vals, lens, 0, NULL, NULL, &id);
    if (status == VANS_OK) {
        status = vans_wait(worker, id);
    }
    EXPECT(status == VANS_ERR_INVALID_ARGUMENT);
    printf("error as expected: %s: %s\n", vans_status_name(status), vans_last_error());

    /* A blocking wait inside a callback is refused instead of stalling the I/O thread. */
    CHECK(vans_pull(worker, keys, 4, vals, sizeof vals, NULL, 0, waits_inside, worker, &id));
    pthread_mutex_lock(&lock);
    while (inner_status == 1) {
        pthread_cond_wait(&changed, &lock);
    }
    pthread_mutex_unlock(&lock);
    printf("wait inside a callback: %s: %s\n", vans_status_name(inner_status), inner_message);
    EXPECT(inner_status == VANS_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(inner_message, "I/O thread") != NULL);

    /* A timed wait that times out leaves the request waitable. The pull goes into a fresh
     * buffer, so that the check sees what it wrote: the one push that succeeded, untouched by
     * the refused ones. */
    float timed[4] = {0, 0, 0, 0};
    CHECK(vans_pull(worker, keys, 4, timed, sizeof timed, NULL, 0, NULL, NULL, &id));
    status = vans_wait_timeout(worker, id, 0);
    EXPECT(status == VANS_OK || status == VANS_ERR_TIMEOUT);
    /* The answer may already be in (the wait then consumed the request); only a wait that
     * timed out leaves it to wait for again. */
    if (status == VANS_ERR_TIMEOUT) {
        CHECK(vans_wait_timeout(worker, id, 30000));
    }
    EXPECT(timed[0] == 1 && timed[1] == 2 && timed[2] == 3 && timed[3] == 4);

    vans_worker_free(worker);
    printf("errors ok\n");
}

/* A vans_config holding the variables the launcher set. */
static vans_config *config_from_launcher(void) {
    static const char *names[] = {"DMLC_ROLE",        "DMLC_NUM_SERVER",  "DMLC_NUM_WORKER",
                                  "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NODE_HOST"};
    vans_config *config;
    CHECK(vans_config_new(&config));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *value = getenv(names[i]);
        if (value != NULL) {
            CHECK(vans_config_set(config, names[i], value));
        }
    }
    CHECK(vans_config_set(config, "VANS_BOOTSTRAP_TIMEOUT_SECS", "30"));
    return config;
}

int main(void) {
    without_a_node();
    vans_config *config = config_from_launcher();
    vans_node *node;
    CHECK(vans_node_start(config, &node));
    vans_config_free(config);
    int role;
    CHECK(vans_node_role(node, &role));
    vans_server *server = NULL;
    if (role == VANS_ROLE_SERVER) {
        CHECK(vans_server_new_sum(node, VANS_F32, 0, 0, 1, &server));
    } else if (role == VANS_ROLE_WORKER) {
        run_worker(node);
    }
    CHECK(vans_node_finalize(node));
    vans_server_free(server);
    vans_node_free(node);
    EXPECT_ERROR(vans_node_barrier(node = NULL, VANS_ALL_GROUPS), VANS_ERR_INVALID_ARGUMENT,
                 "node is NULL");
    return 0;
}
