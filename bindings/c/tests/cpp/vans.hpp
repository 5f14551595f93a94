// A small RAII C++ wrapper over the vans C API (include/vans.h): handles that free
// themselves, errors as exceptions, callbacks as std::function. Header-only; C++17.
#ifndef VANS_HPP
#define VANS_HPP

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "vans.h"

namespace vans {

// A failed call: the status code and the library's message.
class Error : public std::runtime_error {
public:
    Error(int status, const std::string &message)
        : std::runtime_error(std::string(vans_status_name(status)) + ": " + message),
          status_(status) {}
    int status() const { return status_; }

private:
    int status_;
};

// Throws an Error unless `status` is VANS_OK.
inline void check(int status) {
    if (status != VANS_OK) {
        throw Error(status, vans_last_error());
    }
}

template <class T> constexpr int dtype_of();
template <> constexpr int dtype_of<float>() { return VANS_F32; }
template <> constexpr int dtype_of<double>() { return VANS_F64; }
template <> constexpr int dtype_of<int32_t>() { return VANS_I32; }
template <> constexpr int dtype_of<int64_t>() { return VANS_I64; }
template <> constexpr int dtype_of<uint8_t>() { return VANS_U8; }
template <> constexpr int dtype_of<uint64_t>() { return VANS_U64; }

// A node of the cluster; finalize() before it goes, or it stops without a barrier.
class Node {
public:
    // Joins the cluster the environment (DMLC_*, TF_CONFIG) describes.
    static Node from_env() {
        vans_node *node = nullptr;
        check(vans_node_start_env(&node));
        return Node(node);
    }

    int role() const { return query<int>(vans_node_role); }
    int id() const { return query<int>(vans_node_id); }
    uint32_t rank() const { return query<uint32_t>(vans_node_rank); }
    uint32_t num_servers() const { return query<uint32_t>(vans_node_num_servers); }
    uint32_t num_workers() const { return query<uint32_t>(vans_node_num_workers); }
    void barrier(int group) const { check(vans_node_barrier(handle_.get(), group)); }
    void finalize() const { check(vans_node_finalize(handle_.get())); }
    const vans_node *get() const { return handle_.get(); }

private:
    explicit Node(vans_node *node) : handle_(node, vans_node_free) {}

    template <class T, class F> T query(F f) const {
        T out{};
        check(f(handle_.get(), &out));
        return out;
    }

    std::unique_ptr<vans_node, void (*)(vans_node *)> handle_;
};

// A server application; it answers until the node stops.
class Server {
public:
    // ps-lite's default handle: sums pushes, answers pulls.
    template <class T> static Server sum(const Node &node, int app_id = 0, size_t shards = 1) {
        vans_server *server = nullptr;
        check(vans_server_new_sum(node.get(), dtype_of<T>(), app_id, 0, shards, &server));
        return Server(server);
    }

private:
    explicit Server(vans_server *server) : handle_(server, vans_server_free) {}
    std::unique_ptr<vans_server, void (*)(vans_server *)> handle_;
};

// A worker application for values of type T.
template <class T> class Worker {
public:
    // Called on an I/O thread with the request's status; must not block or throw.
    using Done = std::function<void(int status)>;

    explicit Worker(const Node &node, int app_id = 0) : handle_(nullptr, vans_worker_free) {
        vans_worker *worker = nullptr;
        check(vans_worker_new(node.get(), dtype_of<T>(), app_id, 0, &worker));
        handle_.reset(worker);
    }

    // Pushes without copying `vals`: keep it alive and unchanged until wait(id) returns.
    int64_t push(const std::vector<uint64_t> &keys, const std::vector<T> &vals) {
        int64_t id = 0;
        check(vans_push(handle_.get(), keys.data(), keys.size(), vals.data(),
                        vals.size() * sizeof(T), nullptr, 0, nullptr, nullptr, &id));
        return id;
    }

    // Pushes, reporting through `done` (same lifetime rule for `vals`, until `done` ran).
    void push(const std::vector<uint64_t> &keys, const std::vector<T> &vals, Done done) {
        auto *callback = new Done(std::move(done));
        int status = vans_push(handle_.get(), keys.data(), keys.size(), vals.data(),
                               vals.size() * sizeof(T), nullptr, 0, trampoline, callback, nullptr);
        if (status != VANS_OK) {
            delete callback;
            check(status);
        }
    }

    // Pulls into `out`, which must already have the size of the answer (ps-lite's ZPull).
    int64_t pull(const std::vector<uint64_t> &keys, std::vector<T> &out) {
        int64_t id = 0;
        check(vans_pull(handle_.get(), keys.data(), keys.size(), out.data(),
                        out.size() * sizeof(T), nullptr, 0, nullptr, nullptr, &id));
        return id;
    }

    // Waits for a request issued without a callback.
    void wait(int64_t id) { check(vans_wait(handle_.get(), id)); }

private:
    static void trampoline(void *user_data, int64_t, int status) {
        std::unique_ptr<Done> done(static_cast<Done *>(user_data));
        try {
            (*done)(status);
        } catch (...) {
            // Nothing may unwind into the library.
        }
    }

    std::unique_ptr<vans_worker, void (*)(vans_worker *)> handle_;
};

}  // namespace vans

#endif
