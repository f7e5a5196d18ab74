#include "tools/make_model/make_model.h"
#include "ds4_version.h"

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-make-model");
        return 0;
    }
    return ds4::make_model::make_model_main(argc, argv);
}
