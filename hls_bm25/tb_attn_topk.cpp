// C-simulation testbench of attn_topk: runs each case exported by tb_attn_export.py (the CPU reference's kernel
// launch for one sparse attention method) through the kernel and compares every unit score's bits and the top-k
// unit ids with the CPU reference's.
//
// usage: tb_attn_topk CASES     (exit 0 when every case matches)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attn_topk.h"

namespace {

[[noreturn]] void die(const std::string& msg) {
    std::fprintf(stderr, "tb_attn_topk: %s\n", msg.c_str());
    std::exit(2);
}

std::vector<uint32_t> read_words(std::istream& in, bool hex) {
    std::string line;
    if (!std::getline(in, line)) die("truncated cases file");
    std::istringstream ls(line);
    std::vector<uint32_t> out;
    std::string tok;
    while (ls >> tok) out.push_back(static_cast<uint32_t>(std::strtoul(tok.c_str(), nullptr, hex ? 16 : 10)));
    return out;
}

std::vector<float> as_floats(const std::vector<uint32_t>& bits) {
    std::vector<float> f(bits.size());
    if (!bits.empty()) std::memcpy(f.data(), bits.data(), bits.size() * 4);
    return f;
}

// [rows][keys][dim] f32 -> whole 512-bit words per key, zero-padded: the HBM image.
std::vector<KeyWord> image(const std::vector<float>& keys, size_t rows_keys, uint32_t dim) {
    const uint32_t words = (dim + ATTN_WORD_LANES - 1) / ATTN_WORD_LANES;
    std::vector<KeyWord> out(rows_keys * words + 1);
    std::memset(out.data(), 0, out.size() * sizeof(KeyWord));
    for (size_t j = 0; j < rows_keys; ++j)
        for (uint32_t d = 0; d < dim; ++d) out[j * words + d / ATTN_WORD_LANES].v[d % ATTN_WORD_LANES] = keys[j * dim + d];
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CASES\n", argv[0]);
        return 2;
    }
    std::ifstream in(argv[1]);
    if (!in) die(std::string("cannot open ") + argv[1]);
    std::string word;
    size_t num_cases = 0;
    in >> word >> num_cases;
    if (word != "cases") die("expected 'cases N'");
    std::string rest;
    std::getline(in, rest);
    size_t failures = 0;
    for (size_t c = 0; c < num_cases; ++c) {
        std::string header;
        if (!std::getline(in, header)) die("truncated cases file");
        std::istringstream hs(header);
        std::string tag, name;
        uint32_t mode, rows, heads, dim, num_keys, unit, mid_start, mid_end, k;
        hs >> tag >> name >> mode >> rows >> heads >> dim >> num_keys >> unit >> mid_start >> mid_end >> k;
        if (tag != "case" || !hs) die("bad case header: " + header);
        const std::vector<float> q = as_floats(read_words(in, true));
        std::vector<float> w = as_floats(read_words(in, true));
        const std::vector<float> lo = as_floats(read_words(in, true));
        const std::vector<float> hi = as_floats(read_words(in, true));
        const std::vector<uint32_t> expect_scores = read_words(in, true);
        const std::vector<uint32_t> expect_ids = read_words(in, false);
        const uint32_t num_units = (num_keys + unit - 1) / unit;
        if (q.size() != size_t(rows) * heads * dim || lo.size() != size_t(rows) * num_keys * dim ||
            expect_scores.size() != size_t(rows) * num_units || expect_ids.size() != size_t(rows) * k)
            die("case " + name + ": sizes do not match its header");
        if (w.empty()) w.push_back(0.0f);
        const std::vector<KeyWord> lo_img = image(lo, size_t(rows) * num_keys, dim);
        const std::vector<KeyWord> hi_img = hi.empty() ? std::vector<KeyWord>(1) : image(hi, size_t(rows) * num_keys, dim);
        const uint32_t kk = k ? k : 1;
        std::vector<float> scores(size_t(rows) * num_units), top(size_t(rows) * kk);
        std::vector<uint32_t> ids(size_t(rows) * kk), counts(rows), stats(size_t(rows) * ATTN_NUM_STATS);
        attn_topk(q.data(), w.data(), lo_img.data(), hi_img.data(), scores.data(), ids.data(), top.data(),
                  counts.data(), stats.data(), rows, heads, dim, num_keys, unit, mode, mid_start,
                  k ? mid_end : mid_start, kk);
        size_t bad_scores = 0, bad_ids = 0;
        for (size_t i = 0; i < scores.size(); ++i) {
            uint32_t bits;
            std::memcpy(&bits, &scores[i], 4);
            bad_scores += bits != expect_scores[i];
        }
        for (uint32_t r = 0; r < rows; ++r) {
            bad_ids += counts[r] != k;
            for (uint32_t j = 0; j < k && j < counts[r]; ++j) bad_ids += ids[r * kk + j] != expect_ids[r * k + j];
        }
        if (bad_scores || bad_ids) {
            std::fprintf(stderr, "case %s: %zu unit scores and %zu top-k ids differ\n", name.c_str(), bad_scores,
                         bad_ids);
            ++failures;
        }
        std::printf("case %s (mode %u, %u rows x %u keys, unit %u, k %u): %s\n", name.c_str(), mode, rows, num_keys,
                    unit, k, bad_scores || bad_ids ? "DIFFERENT" : "identical");
    }
    if (failures) {
        std::printf("FAIL: %zu cases differ\n", failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}
