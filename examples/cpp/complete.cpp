// Greedy continuation of a text with the engine in this process (bridge/ds4.hpp over libds4).
//   ./complete MODEL.gguf "def fib(n):"
#include <bridge/ds4.hpp>

#include <cstdio>

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s MODEL PROMPT\n", argv[0]);
        return 2;
    }
    try {
        ds4::bridge::ModelOptions mo;
        mo.model_path = argv[1];
        ds4::bridge::Model model(mo);
        ds4::bridge::Session session(model, 4096);
        session.sync(model.tokenize(argv[2]));
        std::vector<int32_t> out;
        for (int i = 0; i < 16; ++i) {
            const int32_t t = session.argmax();
            if (model.is_stop(t)) break;
            out.push_back(t);
            session.eval(t);
        }
        std::printf("%s\n", model.detokenize(out).c_str());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
