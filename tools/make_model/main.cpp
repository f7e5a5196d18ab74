#include "tools/make_model/make_model.h"

int main(int argc, char **argv) { return ds4::make_model::make_model_main(argc, argv); }
