// ref_logits: runs one GGUF through llama.cpp and prints what the synthetic fixtures' reference files record.
//
// usage: ref_logits MODEL.gguf N_GEN < requests
// stdin:  line 1: the prompt token ids, space separated
//         then any number of lines "T <add_special 0|1> <parse_special 0|1> <text as hex bytes>"
// stdout: "V <n_vocab>"
//         "L <pos> <logit>..."            the logits of every prompt position (the whole prompt in one batch)
//         "G <step> <token> <id>:<logit>..." greedy continuation: the pick and the top 5 it was picked from
//         "T <index> <id>..."              llama_tokenize's ids for request line <index>
//         "I <text>"                       llama.cpp's log lines that say what it resolved (flash attention etc.)
//                                          and its system info (the CPU features its kernels used)
// Settings: 1 thread, context 64, batch 64, default KV cache types (f16), CPU only.
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static std::vector<std::string> g_info;

static void log_cb(enum ggml_log_level level, const char * text, void *) {
    std::string s(text);
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fprintf(stderr, "%s", text);
    }
    if (s.find("Flash Attention") != std::string::npos || s.find("n_swa") != std::string::npos ||
        s.find("causal_attn") != std::string::npos || s.find("rope type") != std::string::npos) {
        while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
            s.pop_back();
        }
        g_info.push_back(s);
    }
}

static std::string from_hex(const std::string & hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        out.push_back((char) strtol(hex.substr(i, 2).c_str(), nullptr, 16));
    }
    return out;
}

// ids of the k largest logits, ties broken by the smaller id
static std::vector<int> top_k(const float * logits, int n_vocab, int k) {
    std::vector<int> ids(n_vocab);
    for (int i = 0; i < n_vocab; i++) {
        ids[i] = i;
    }
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    ids.resize(k);
    return ids;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf N_GEN < requests\n", argv[0]);
        return 2;
    }
    const int n_gen = atoi(argv[2]);

    std::string line;
    std::vector<llama_token> prompt;
    if (!std::getline(std::cin, line)) {
        fprintf(stderr, "missing prompt line\n");
        return 2;
    }
    {
        std::istringstream is(line);
        int id;
        while (is >> id) {
            prompt.push_back(id);
        }
    }
    std::vector<std::string> requests;
    while (std::getline(std::cin, line)) {
        if (!line.empty()) {
            requests.push_back(line);
        }
    }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (model == nullptr) {
        fprintf(stderr, "llama.cpp refused to load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 64;
    cparams.n_batch = 64;
    cparams.n_ubatch = 64;
    cparams.n_threads = 1;
    cparams.n_threads_batch = 1;
    cparams.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "llama.cpp could not create a context for %s\n", argv[1]);
        return 1;
    }

    printf("V %d\n", n_vocab);
    const int n_prompt = (int) prompt.size();
    llama_batch batch = llama_batch_init(std::max(n_prompt, 1), 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i] = prompt[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_prompt;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed on the prompt\n");
        return 1;
    }
    for (int i = 0; i < n_prompt; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        printf("L %d", i);
        for (int v = 0; v < n_vocab; v++) {
            printf(" %.9g", l[v]);
        }
        printf("\n");
    }

    std::vector<float> cur(llama_get_logits_ith(ctx, n_prompt - 1), llama_get_logits_ith(ctx, n_prompt - 1) + n_vocab);
    for (int step = 0; step < n_gen; step++) {
        const std::vector<int> top = top_k(cur.data(), n_vocab, 5);
        printf("G %d %d", step, top[0]);
        for (int id : top) {
            printf(" %d:%.9g", id, cur[id]);
        }
        printf("\n");
        if (step + 1 == n_gen) {
            break;
        }
        batch.token[0] = top[0];
        batch.pos[0] = n_prompt + step;
        batch.n_seq_id[0] = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0] = 1;
        batch.n_tokens = 1;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_decode failed at step %d\n", step);
            return 1;
        }
        const float * l = llama_get_logits_ith(ctx, 0);
        cur.assign(l, l + n_vocab);
    }

    for (size_t r = 0; r < requests.size(); r++) {
        std::istringstream is(requests[r]);
        std::string tag, hex;
        int add_special = 0, parse_special = 0;
        is >> tag >> add_special >> parse_special >> hex;
        const std::string text = from_hex(hex);
        std::vector<llama_token> ids(text.size() + 16);
        int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), add_special != 0,
                               parse_special != 0);
        if (n < 0) {
            ids.resize(-n);
            n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), add_special != 0,
                               parse_special != 0);
        }
        printf("T %zu", r);
        for (int i = 0; i < n; i++) {
            printf(" %d", ids[i]);
        }
        printf("\n");
    }
    for (const std::string & s : g_info) {
        printf("I %s\n", s.c_str());
    }
    printf("I system: %s\n", llama_print_system_info());

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
