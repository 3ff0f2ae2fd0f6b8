// hls::stream for g++ C simulation, written for ragserve (not the vendor header).
// Only this directory is on the include path under g++; Vitis HLS uses its own <hls_stream.h>.
// As in Vitis C simulation, dataflow processes run one after another, so a stream is an unbounded FIFO
// and reading an empty stream is a protocol error of the design (reported and aborted here).
#ifndef RAGSERVE_HLS_STREAM_SHIM_H
#define RAGSERVE_HLS_STREAM_SHIM_H

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>

namespace hls {

template <typename T>
class stream {
public:
    stream() : name_("stream") {}
    explicit stream(const char* name) : name_(name) {}
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;

    T read() {
        if (q_.empty()) {
            std::fprintf(stderr, "hls::stream '%s': read while empty (the design would deadlock)\n", name_.c_str());
            std::abort();
        }
        T v = q_.front();
        q_.pop_front();
        return v;
    }
    void read(T& v) { v = read(); }
    void write(const T& v) { q_.push_back(v); }
    bool empty() const { return q_.empty(); }
    bool full() const { return false; }
    std::size_t size() const { return q_.size(); }
    stream& operator>>(T& v) { v = read(); return *this; }
    stream& operator<<(const T& v) { write(v); return *this; }

private:
    std::string name_;
    std::deque<T> q_;
};

}  // namespace hls

#endif
