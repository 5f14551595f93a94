/*
 * The rendezvous from C, between a server task and a worker task, with the protocol named by
 * argv[1] ("pull" or "push"). For each step the worker sends a ping, the server receives it
 * and sends it back reversed as the pong, which the worker receives: into a library buffer,
 * into its own buffer, and by callback. Also: a lent (zero-copy) send gives its buffer back
 * through the release callback, a too-small receive buffer and a malformed key are errors
 * naming the problem, a receive times out, cleaning up a step fails its pending receive, and
 * a tensor already there completes vans_rendezvous_recv_async_inline on the calling thread
 * (vans_rendezvous_recv_async on another).
 *
 * Prints "rendezvous ok: <protocol>, N steps" on the worker.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

#define STEPS 3
#define BIG 100

static int server_id = 8;
static int worker_id = 9;

static void key(int from, int to, const char *name, uint64_t step, char *out, size_t capacity) {
    size_t len;
    CHECK(vans_rendezvous_key(from, 1, to, name, 0, step, out, capacity, &len));
}

/* A ping of step `step`: 1000 * step + 3 bytes. */
static size_t ping_len(int step) { return 1000 * (size_t)step + 3; }

static void run_server(vans_rendezvous *rdv) {
    char k[256];
    for (int step = 0; step < STEPS; step++) {
        key(worker_id, server_id, "ping", (uint64_t)step, k, sizeof k);
        vans_buffer *ping;
        bool dead = true;
        CHECK(vans_rendezvous_recv(rdv, step, k, 0, &ping, &dead));
        EXPECT(!dead);
        size_t len = vans_buffer_len(ping);
        EXPECT(len == ping_len(step));
        const unsigned char *in = vans_buffer_data(ping);
        unsigned char *pong = malloc(len);
        EXPECT(pong != NULL);
        for (size_t i = 0; i < len; i++) {
            pong[i] = in[len - 1 - i];
        }
        vans_buffer_free(ping);
        /* Lent without a copy: the library frees it when it is done with it. Step 0's pong
         * carries a header beside it. */
        key(server_id, worker_id, "pong", (uint64_t)step, k, sizeof k);
        if (step == 0) {
            CHECK(vans_rendezvous_send_with_header(rdv, step, k, "pong header", 11, pong, len,
                                                   false, free, pong));
        } else {
            CHECK(vans_rendezvous_send(rdv, step, k, pong, len, false, free, pong));
        }
    }
    static unsigned char big[BIG];
    key(server_id, worker_id, "big", 0, k, sizeof k);
    CHECK(vans_rendezvous_send(rdv, STEPS, k, big, sizeof big, false, NULL, NULL));
}

/* Completions of callbacks, under one lock. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int releases = 0;
static int received = 0;
static int received_status = 1;
static vans_buffer *received_value = NULL;
static char received_message[512];
static pthread_t received_thread;

static void on_release(void *user_data) {
    (void)user_data;
    pthread_mutex_lock(&lock);
    releases++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static void on_received(void *user_data, int status, vans_buffer *value, bool is_dead) {
    (void)user_data;
    (void)is_dead;
    pthread_mutex_lock(&lock);
    received++;
    received_status = status;
    received_value = value;
    received_thread = pthread_self();
    snprintf(received_message, sizeof received_message, "%s", vans_last_error());
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

/* Waits until *counter reaches `count`, up to 10 seconds. */
static void wait_count(int *counter, int count) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    pthread_mutex_lock(&lock);
    while (*counter < count) {
        if (pthread_cond_timedwait(&changed, &lock, &deadline) != 0) {
            break;
        }
    }
    int reached = *counter;
    pthread_mutex_unlock(&lock);
    EXPECT(reached >= count);
}

static void expect_pong(const unsigned char *ping, const unsigned char *pong, size_t len) {
    for (size_t i = 0; i < len; i++) {
        EXPECT(pong[i] == ping[len - 1 - i]);
    }
}

static void run_worker(vans_rendezvous *rdv, const char *protocol) {
    char k[256];
    static unsigned char ping[STEPS][1000 * STEPS + 3];
    static unsigned char pong[1000 * STEPS + 3];
    for (int step = 0; step < STEPS; step++) {
        size_t len = ping_len(step);
        for (size_t i = 0; i < len; i++) {
            ping[step][i] = (unsigned char)(i * 7 + (size_t)step);
        }
        key(worker_id, server_id, "ping", (uint64_t)step, k, sizeof k);
        if (step == 1) {
            /* Lent: must stay untouched until on_release runs. */
            CHECK(vans_rendezvous_send(rdv, step, k, ping[step], len, false, on_release, NULL));
        } else {
            CHECK(vans_rendezvous_send(rdv, step, k, ping[step], len, false, NULL, NULL));
        }
        key(server_id, worker_id, "pong", (uint64_t)step, k, sizeof k);
        if (step == 0) {
            vans_buffer *value;
            CHECK(vans_rendezvous_recv(rdv, step, k, 0, &value, NULL));
            EXPECT(vans_buffer_len(value) == len);
            expect_pong(ping[step], vans_buffer_data(value), len);
            size_t header_len = 0;
            const char *header = vans_buffer_header(value, &header_len);
            EXPECT(header_len == 11 && memcmp(header, "pong header", 11) == 0);
            vans_buffer_free(value);
        } else if (step == 1) {
            size_t got = 0;
            bool dead = true;
            CHECK(vans_rendezvous_recv_into(rdv, step, k, 0, pong, sizeof pong, &got, &dead));
            EXPECT(got == len && !dead);
            expect_pong(ping[step], pong, len);
        } else {
            CHECK(vans_rendezvous_recv_async(rdv, step, k, on_received, NULL));
            wait_count(&received, 1);
            EXPECT(received_status == VANS_OK);
            EXPECT(vans_buffer_len(received_value) == len);
            expect_pong(ping[step], vans_buffer_data(received_value), len);
            size_t header_len = 1;
            EXPECT(vans_buffer_header(received_value, &header_len) != NULL && header_len == 0);
            vans_buffer_free(received_value);
        }
        CHECK(vans_rendezvous_cleanup(rdv, step));
    }
    /* The lent ping came back. */
    wait_count(&releases, 1);

    /* A buffer too small for the tensor: both sizes named, the size reported. */
    key(server_id, worker_id, "big", 0, k, sizeof k);
    unsigned char small[10];
    size_t got = 0;
    EXPECT_ERROR(vans_rendezvous_recv_into(rdv, STEPS, k, 0, small, sizeof small, &got, NULL),
                 VANS_ERR_INVALID_ARGUMENT, "has 100 bytes but the buffer holds 10");
    EXPECT(got == BIG);

    /* A key buffer too small, and a size query. */
    size_t key_len = 0;
    EXPECT_ERROR(vans_rendezvous_key(worker_id, 1, server_id, "x", 0, 0, k, 8, &key_len),
                 VANS_ERR_INVALID_ARGUMENT, "but out holds 8");
    CHECK(vans_rendezvous_key(worker_id, 1, server_id, "x", 0, 0, NULL, 0, &key_len));
    EXPECT(key_len > 8 && key_len < sizeof k);
    EXPECT_ERROR(vans_rendezvous_key(3, 1, server_id, "x", 0, 0, k, sizeof k, &key_len),
                 VANS_ERR_INVALID_ARGUMENT, "src_node 3 is not a node id");

    /* A malformed key is refused, and a lent buffer is still given back. */
    static unsigned char lent[4];
    EXPECT_ERROR(vans_rendezvous_send(rdv, 9, "not;a;key", lent, sizeof lent, false, on_release,
                                      NULL),
                 VANS_ERR_INVALID_ARGUMENT, "key");
    wait_count(&releases, 2);

    /* A receive with a time limit gives up. */
    key(server_id, worker_id, "never", 0, k, sizeof k);
    vans_buffer *value = NULL;
    EXPECT_ERROR(vans_rendezvous_recv(rdv, 50, k, 50, &value, NULL), VANS_ERR_TIMEOUT,
                 "timed out");
    EXPECT(value == NULL);

    /* Cleaning up a step fails its pending receive. */
    CHECK(vans_rendezvous_recv_async(rdv, 100, k, on_received, NULL));
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(vans_rendezvous_cleanup(rdv, 100));
    wait_count(&received, 2);
    EXPECT(received_status == VANS_ERR_RENDEZVOUS);
    EXPECT(received_value == NULL);
    printf("cleanup failed the receive as expected: %s\n", received_message);
    EXPECT(strstr(received_message, "abort") != NULL);

    /* A tensor already in this task's table: the inline receive runs its callback on this
     * thread before it returns; the other hands it to a vans thread. */
    static unsigned char mine[5] = {1, 2, 3, 4, 5};
    key(worker_id, worker_id, "mine", 0, k, sizeof k);
    CHECK(vans_rendezvous_send(rdv, 200, k, mine, sizeof mine, false, NULL, NULL));
    CHECK(vans_rendezvous_recv_async_inline(rdv, 200, k, on_received, NULL));
    pthread_mutex_lock(&lock);
    int done_before_return = received;
    bool on_this_thread = pthread_equal(received_thread, pthread_self());
    pthread_mutex_unlock(&lock);
    EXPECT(done_before_return == 3 && on_this_thread);
    EXPECT(received_status == VANS_OK && vans_buffer_len(received_value) == sizeof mine);
    EXPECT(memcmp(vans_buffer_data(received_value), mine, sizeof mine) == 0);
    vans_buffer_free(received_value);
    CHECK(vans_rendezvous_send(rdv, 201, k, mine, sizeof mine, false, NULL, NULL));
    CHECK(vans_rendezvous_recv_async(rdv, 201, k, on_received, NULL));
    wait_count(&received, 4);
    pthread_mutex_lock(&lock);
    on_this_thread = pthread_equal(received_thread, pthread_self());
    pthread_mutex_unlock(&lock);
    EXPECT(!on_this_thread && received_status == VANS_OK);
    vans_buffer_free(received_value);
    /* A malformed key fails the receive at once: on this thread too. */
    CHECK(vans_rendezvous_recv_async_inline(rdv, 202, "not;a;key", on_received, NULL));
    pthread_mutex_lock(&lock);
    done_before_return = received;
    pthread_mutex_unlock(&lock);
    EXPECT(done_before_return == 5 && received_status == VANS_ERR_INVALID_ARGUMENT);
    EXPECT(received_value == NULL && strstr(received_message, "key") != NULL);
    /* Invalid arguments are errors, and no callback runs. */
    EXPECT_ERROR(vans_rendezvous_recv_async_inline(rdv, 202, k, NULL, NULL),
                 VANS_ERR_INVALID_ARGUMENT, "done is NULL");
    EXPECT(received == 5);
    CHECK(vans_rendezvous_cleanup(rdv, 200));
    CHECK(vans_rendezvous_cleanup(rdv, 201));
    /* A pinned step works as any other, and a cleanup still ends it. */
    CHECK(vans_rendezvous_pin(rdv, 300));
    CHECK(vans_rendezvous_send(rdv, 300, k, mine, sizeof mine, false, NULL, NULL));
    CHECK(vans_rendezvous_recv_async_inline(rdv, 300, k, on_received, NULL));
    EXPECT(received == 6 && received_status == VANS_OK);
    vans_buffer_free(received_value);
    CHECK(vans_rendezvous_cleanup(rdv, 300));

    printf("rendezvous ok: %s, %d steps\n", protocol, STEPS);
}

int main(int argc, char **argv) {
    const char *protocol = argc > 1 ? argv[1] : "pull";
    int mode = strcmp(protocol, "push") == 0 ? VANS_RENDEZVOUS_PUSH : VANS_RENDEZVOUS_PULL;
    vans_node *node;
    CHECK(vans_node_start_env(&node));
    int role;
    CHECK(vans_node_role(node, &role));
    if (role != VANS_ROLE_SCHEDULER) {
        vans_rendezvous *rdv;
        CHECK(vans_rendezvous_start(node, mode, &rdv));
        if (role == VANS_ROLE_SERVER) {
            run_server(rdv);
        } else {
            run_worker(rdv, protocol);
        }
        /* Both tasks are done with each other before either rendezvous goes. */
        CHECK(vans_node_barrier(node, VANS_SERVER_GROUP | VANS_WORKER_GROUP));
        vans_rendezvous_free(rdv);
    }
    CHECK(vans_node_finalize(node));
    vans_node_free(node);
    return 0;
}
