// ps-lite's tests/test_kv_app.cc in C++, over the RAII wrapper vans.hpp: each worker pushes
// the same values REPEAT times (waiting by id and by callback), the workers meet at a
// barrier, then each pulls into its own vector and checks REPEAT x num_workers x value.
// Prints "worker rank R: N keys, sum of pulled values S"; exits non-zero on any mismatch.
#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "vans.hpp"

namespace {

constexpr int kNumKeys = 1000;
constexpr int kRepeat = 6;

void run_worker(const vans::Node &node) {
    vans::Worker<float> worker(node);
    std::vector<uint64_t> keys(kNumKeys);
    std::vector<float> vals(kNumKeys);
    for (int i = 0; i < kNumKeys; i++) {
        keys[i] = (UINT64_MAX / kNumKeys) * static_cast<uint64_t>(i) + 3;
        vals[i] = static_cast<float>(i % 89 + 1);
    }

    std::mutex lock;
    std::condition_variable changed;
    int completed = 0;
    int failed = 0;
    std::vector<int64_t> ids;
    for (int r = 0; r < kRepeat / 2; r++) {
        ids.push_back(worker.push(keys, vals));
        worker.push(keys, vals, [&](int status) {
            std::lock_guard<std::mutex> guard(lock);
            failed += status != VANS_OK;
            completed++;
            changed.notify_one();
        });
    }
    for (int64_t id : ids) {
        worker.wait(id);
    }
    {
        std::unique_lock<std::mutex> guard(lock);
        changed.wait(guard, [&] { return completed == kRepeat / 2; });
    }
    if (failed != 0) {
        throw std::runtime_error("a push reported by callback failed");
    }
    node.barrier(VANS_WORKER_GROUP);

    std::vector<float> pulled(kNumKeys);
    worker.wait(worker.pull(keys, pulled));
    double sum = 0;
    const float times = static_cast<float>(kRepeat * node.num_workers());
    for (int i = 0; i < kNumKeys; i++) {
        if (pulled[i] != vals[i] * times) {
            std::fprintf(stderr, "key %d: pulled %f, expected %f\n", i, pulled[i], vals[i] * times);
            std::exit(4);
        }
        sum += pulled[i];
    }

    // The wrong output size is an exception naming both sizes.
    std::vector<float> short_out(kNumKeys - 1);
    try {
        worker.wait(worker.pull(keys, short_out));
        std::fprintf(stderr, "a pull into a short vector succeeded\n");
        std::exit(5);
    } catch (const vans::Error &error) {
        if (error.status() != VANS_ERR_INVALID_ARGUMENT) {
            throw;
        }
        std::printf("error as expected: %s\n", error.what());
    }
    std::printf("worker rank %u: %d keys, sum of pulled values %.0f\n", node.rank(), kNumKeys, sum);
}

}  // namespace

int main() {
    try {
        vans::Node node = vans::Node::from_env();
        if (node.role() == VANS_ROLE_SERVER) {
            vans::Server server = vans::Server::sum<float>(node, 0, 2);
            node.finalize();
        } else {
            if (node.role() == VANS_ROLE_WORKER) {
                run_worker(node);
            }
            node.finalize();
        }
    } catch (const std::exception &error) {
        std::fprintf(stderr, "test_kv_app.cc: %s\n", error.what());
        return 2;
    }
    return 0;
}
