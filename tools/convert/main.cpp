#include "tools/convert/convert.h"
#include "ds4_version.h"

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-convert");
        return 0;
    }
    return ds4::convert::convert_main(argc, argv);
}
