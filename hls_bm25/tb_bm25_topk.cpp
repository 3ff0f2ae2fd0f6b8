// C-simulation testbench of bm25_topk: loads an index directory written by `ragserve index` (the layout files of
// indexer/FORMAT.md, read directly), runs every pre-analysed query through one kernel call per shard (several
// queries per launch), merges the per-shard top-k on the host side and compares ids and score bits with the
// results the CPU backend exported (hls_bm25/tb_export.py writes both input files).
//
// usage: tb_bm25_topk INDEX_DIR QUERIES EXPECTED [BATCH]
//   QUERIES : "cache" + 256 hex f32 words, "nq N", then N lines "T t1 w1 ... tT wT" (w as hex f32 bits)
//   EXPECTED: sections "k K" followed by N lines "n d1 s1 ... dn sn" (s as hex f32 bits)
// Exit status 0 when every query of every section matches.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bm25_topk.h"

namespace {

[[noreturn]] void die(const std::string& msg) {
    std::fprintf(stderr, "tb_bm25_topk: %s\n", msg.c_str());
    std::exit(2);
}

// ---- a minimal JSON reader, enough for manifest.json ------------------------------------------------------------
struct Json {
    enum Kind { NUL, BOOL, NUM, STR, ARR, OBJ } kind = NUL;
    double num = 0;
    std::string str;
    std::vector<Json> arr;
    std::map<std::string, Json> obj;

    const Json& at(const std::string& key) const {
        auto it = obj.find(key);
        if (kind != OBJ || it == obj.end()) die("manifest.json: missing key '" + key + "'");
        return it->second;
    }
    uint64_t u() const {
        if (kind != NUM || num < 0) die("manifest.json: expected a non-negative number");
        return static_cast<uint64_t>(num);
    }
};

class JsonParser {
public:
    explicit JsonParser(const std::string& s) : s_(s) {}
    Json parse() {
        Json v = value();
        ws();
        if (i_ != s_.size()) die("manifest.json: trailing characters");
        return v;
    }

private:
    const std::string& s_;
    size_t i_ = 0;

    void ws() {
        while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    char peek() {
        ws();
        if (i_ >= s_.size()) die("manifest.json: unexpected end");
        return s_[i_];
    }
    void expect(char c) {
        if (peek() != c) die(std::string("manifest.json: expected '") + c + "'");
        ++i_;
    }
    std::string string() {
        expect('"');
        std::string out;
        while (i_ < s_.size() && s_[i_] != '"') {
            if (s_[i_] == '\\') {
                ++i_;
                if (i_ >= s_.size()) break;
                const char e = s_[i_];
                if (e == 'u') {  // keys and dirs are ASCII; other escapes only need skipping
                    i_ += 4;
                    out += '?';
                } else {
                    out += (e == 'n' ? '\n' : e == 't' ? '\t' : e);
                }
                ++i_;
            } else {
                out += s_[i_++];
            }
        }
        expect('"');
        return out;
    }
    Json value() {
        Json v;
        const char c = peek();
        if (c == '{') {
            v.kind = Json::OBJ;
            ++i_;
            if (peek() == '}') { ++i_; return v; }
            while (true) {
                std::string key = string();
                expect(':');
                v.obj[key] = value();
                if (peek() == ',') { ++i_; continue; }
                expect('}');
                return v;
            }
        }
        if (c == '[') {
            v.kind = Json::ARR;
            ++i_;
            if (peek() == ']') { ++i_; return v; }
            while (true) {
                v.arr.push_back(value());
                if (peek() == ',') { ++i_; continue; }
                expect(']');
                return v;
            }
        }
        if (c == '"') {
            v.kind = Json::STR;
            v.str = string();
            return v;
        }
        if (s_.compare(i_, 4, "true") == 0) { i_ += 4; v.kind = Json::BOOL; v.num = 1; return v; }
        if (s_.compare(i_, 5, "false") == 0) { i_ += 5; v.kind = Json::BOOL; return v; }
        if (s_.compare(i_, 4, "null") == 0) { i_ += 4; return v; }
        char* endp = nullptr;
        v.kind = Json::NUM;
        v.num = std::strtod(s_.c_str() + i_, &endp);
        if (endp == s_.c_str() + i_) die("manifest.json: bad value");
        i_ = static_cast<size_t>(endp - s_.c_str());
        return v;
    }
};

// ---- index layout ------------------------------------------------------------------------------------------------
template <typename T>
std::vector<T> read_array(const std::string& path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) die("cannot open " + path);
    const std::streamsize bytes = f.tellg();
    if (bytes % static_cast<std::streamsize>(sizeof(T)) != 0) die(path + ": size is not a multiple of the dtype");
    std::vector<T> v(static_cast<size_t>(bytes) / sizeof(T));
    f.seekg(0);
    if (bytes > 0 && !f.read(reinterpret_cast<char*>(v.data()), bytes)) die("cannot read " + path);
    return v;
}

// 64-byte aligned, zero-padded copy as a host would place it in the HBM bank (whole 512-bit words).
template <typename Word, typename T>
std::vector<Word> to_words(const T* data, size_t n) {
    const size_t per = sizeof(Word) / sizeof(T);
    std::vector<Word> words((n + per - 1) / per + 1);
    std::memset(words.data(), 0, words.size() * sizeof(Word));
    if (n) std::memcpy(words.data(), data, n * sizeof(T));
    return words;
}

struct ShardImage {
    uint32_t doc_start, doc_end, block_start, block_end;
    std::vector<PostWord> postings;
    std::vector<NormWord> norms;
    std::vector<uint32_t> term_ptr, blk_id, blk_start;
};

struct Index {
    uint32_t block_bits = 0, tf_bits = 0;
    std::vector<ShardImage> shards;
};

Index load_index(const std::string& dir) {
    std::ifstream mf(dir + "/manifest.json");
    if (!mf) die(dir + ": not an index (no manifest.json)");
    std::stringstream ss;
    ss << mf.rdbuf();
    const std::string text = ss.str();
    const Json m = JsonParser(text).parse();
    Index ix;
    const uint64_t block_size = m.at("layout").at("block_size").u();
    while ((1ull << ix.block_bits) < block_size) ++ix.block_bits;
    if ((1ull << ix.block_bits) != block_size) die("block_size is not a power of two");
    if (ix.block_bits < BM25_MIN_BLOCK_BITS || ix.block_bits > BM25_MAX_BLOCK_BITS)
        die("block_size out of the kernel's range [64, 2^18]");
    ix.tf_bits = static_cast<uint32_t>(m.at("layout").at("tf_bits").u());
    const std::vector<uint8_t> norms = read_array<uint8_t>(dir + "/norms.u8");
    for (const Json& s : m.at("shards").arr) {
        ShardImage sh;
        sh.doc_start = static_cast<uint32_t>(s.at("doc_start").u());
        sh.doc_end = static_cast<uint32_t>(s.at("doc_end").u());
        sh.block_start = static_cast<uint32_t>(s.at("block_start").u());
        sh.block_end = static_cast<uint32_t>(s.at("block_end").u());
        if (sh.doc_start != sh.block_start << ix.block_bits) die("shard does not start on a block boundary");
        const std::string d = dir + "/" + s.at("dir").str + "/";
        const std::vector<uint32_t> post = read_array<uint32_t>(d + "postings.u32");
        sh.postings = to_words<PostWord>(post.data(), post.size());
        sh.norms = to_words<NormWord>(norms.data() + sh.doc_start, sh.doc_end - sh.doc_start);
        sh.term_ptr = read_array<uint32_t>(d + "term_ptr.u32");
        sh.blk_id = read_array<uint32_t>(d + "blk_id.u32");
        sh.blk_start = read_array<uint32_t>(d + "blk_start.u32");
        ix.shards.push_back(std::move(sh));
    }
    return ix;
}

// ---- queries and expected results --------------------------------------------------------------------------------
float bits_to_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint32_t float_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

struct Query {
    std::vector<uint32_t> terms;
    std::vector<float> weights;
};

struct Result {
    std::vector<uint32_t> docs;
    std::vector<uint32_t> score_bits;
};

std::string next_token(std::istream& in, const char* what) {
    std::string tok;
    if (!(in >> tok)) die(std::string("unexpected end of file reading ") + what);
    return tok;
}

uint32_t next_u32(std::istream& in, const char* what, int base = 10) {
    const std::string tok = next_token(in, what);
    char* endp = nullptr;
    const unsigned long v = std::strtoul(tok.c_str(), &endp, base);
    if (*endp != '\0') die(std::string("bad number '") + tok + "' in " + what);
    return static_cast<uint32_t>(v);
}

void load_queries(const std::string& path, std::vector<float>& cache, std::vector<Query>& queries) {
    std::ifstream in(path);
    if (!in) die("cannot open " + path);
    if (next_token(in, "queries header") != "cache") die(path + ": expected 'cache'");
    cache.resize(BM25_CACHE_SIZE);
    for (float& c : cache) c = bits_to_float(next_u32(in, "cache", 16));
    if (next_token(in, "queries header") != "nq") die(path + ": expected 'nq'");
    queries.resize(next_u32(in, "nq"));
    for (Query& q : queries) {
        const uint32_t t = next_u32(in, "query terms");
        if (t > BM25_MAX_TERMS) die("a query has more terms than the kernel's BM25_MAX_TERMS");
        for (uint32_t i = 0; i < t; ++i) {
            q.terms.push_back(next_u32(in, "term id"));
            q.weights.push_back(bits_to_float(next_u32(in, "weight", 16)));
        }
    }
}

std::vector<std::pair<uint32_t, std::vector<Result>>> load_expected(const std::string& path, size_t nq) {
    std::ifstream in(path);
    if (!in) die("cannot open " + path);
    std::vector<std::pair<uint32_t, std::vector<Result>>> sections;
    std::string tok;
    while (in >> tok) {
        if (tok != "k") die(path + ": expected 'k'");
        const uint32_t k = next_u32(in, "k");
        std::vector<Result> res(nq);
        for (Result& r : res) {
            const uint32_t n = next_u32(in, "result count");
            for (uint32_t i = 0; i < n; ++i) {
                r.docs.push_back(next_u32(in, "docid"));
                r.score_bits.push_back(next_u32(in, "score", 16));
            }
        }
        sections.emplace_back(k, std::move(res));
    }
    return sections;
}

// ---- host side: launch per shard, merge ---------------------------------------------------------------------------
std::vector<Result> run_batch(const Index& ix, const std::vector<float>& cache, const std::vector<Query>& queries,
                              size_t first, size_t count, uint32_t k) {
    std::vector<uint32_t> q_off{0}, q_terms;
    std::vector<float> q_weights;
    for (size_t q = first; q < first + count; ++q) {
        q_terms.insert(q_terms.end(), queries[q].terms.begin(), queries[q].terms.end());
        q_weights.insert(q_weights.end(), queries[q].weights.begin(), queries[q].weights.end());
        q_off.push_back(static_cast<uint32_t>(q_terms.size()));
    }
    q_terms.push_back(0);  // keep data() valid for a batch of empty queries
    q_weights.push_back(0.0f);
    struct Hit { float s; uint32_t d; };
    std::vector<std::vector<Hit>> merged(count);
    std::vector<uint32_t> docids(count * k), counts(count), stats(count * BM25_NUM_STATS);
    std::vector<float> scores(count * k);
    for (const ShardImage& sh : ix.shards) {
        bm25_topk(sh.postings.data(), sh.norms.data(), sh.term_ptr.data(), sh.blk_id.data(), sh.blk_start.data(),
                  cache.data(), q_off.data(), q_terms.data(), q_weights.data(), docids.data(), scores.data(),
                  counts.data(), stats.data(), static_cast<uint32_t>(count), k, sh.block_start, sh.block_end,
                  sh.doc_start, sh.doc_end, ix.block_bits, ix.tf_bits);
        for (size_t q = 0; q < count; ++q)
            for (uint32_t j = 0; j < counts[q]; ++j) merged[q].push_back(Hit{scores[q * k + j], docids[q * k + j]});
    }
    std::vector<Result> out(count);
    for (size_t q = 0; q < count; ++q) {
        std::vector<Hit>& h = merged[q];
        std::sort(h.begin(), h.end(), [](const Hit& a, const Hit& b) { return a.s > b.s || (a.s == b.s && a.d < b.d); });
        if (h.size() > k) h.resize(k);
        for (const Hit& x : h) {
            out[q].docs.push_back(x.d);
            out[q].score_bits.push_back(float_to_bits(x.s));
        }
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4 || argc > 5) {
        std::fprintf(stderr, "usage: %s INDEX_DIR QUERIES EXPECTED [BATCH]\n", argv[0]);
        return 2;
    }
    const size_t batch = argc == 5 ? std::strtoul(argv[4], nullptr, 10) : 16;
    if (batch == 0) die("BATCH must be positive");
    const Index ix = load_index(argv[1]);
    std::vector<float> cache;
    std::vector<Query> queries;
    load_queries(argv[2], cache, queries);
    const auto sections = load_expected(argv[3], queries.size());
    if (sections.empty()) die("no expected results");
    size_t failures = 0;
    for (const auto& [k, expected] : sections) {
        if (k < 1 || k > BM25_MAX_K) die("k out of the kernel's range [1, 1024]");
        size_t bad = 0;
        for (size_t first = 0; first < queries.size(); first += batch) {
            const size_t count = std::min(batch, queries.size() - first);
            const std::vector<Result> got = run_batch(ix, cache, queries, first, count, k);
            for (size_t q = 0; q < count; ++q) {
                const Result& e = expected[first + q];
                if (got[q].docs != e.docs || got[q].score_bits != e.score_bits) {
                    if (bad < 5) {
                        std::fprintf(stderr, "k=%u query %zu differs: got %zu hits, expected %zu", k, first + q,
                                     got[q].docs.size(), e.docs.size());
                        for (size_t j = 0; j < std::min(got[q].docs.size(), e.docs.size()); ++j) {
                            if (got[q].docs[j] != e.docs[j] || got[q].score_bits[j] != e.score_bits[j]) {
                                std::fprintf(stderr, "; first difference at rank %zu: got %u/%08x expected %u/%08x",
                                             j, got[q].docs[j], got[q].score_bits[j], e.docs[j], e.score_bits[j]);
                                break;
                            }
                        }
                        std::fprintf(stderr, "\n");
                    }
                    ++bad;
                }
            }
        }
        std::printf("k=%u: %zu/%zu queries identical (%zu shards, batch %zu)\n", k, queries.size() - bad,
                    queries.size(), ix.shards.size(), batch);
        failures += bad;
    }
    if (failures) {
        std::printf("FAIL: %zu mismatches\n", failures);
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}
