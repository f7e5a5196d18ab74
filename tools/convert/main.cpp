#include "tools/convert/convert.h"

int main(int argc, char **argv) { return ds4::convert::convert_main(argc, argv); }
