# cmake -DSRC=in.cpp -DDST=out.cpp -P emulate_tile.cmake: a copy of a Q8_0 tile source for
# the emulated tests (tile_emulation.h): in namespace ds4::quant::detail::emu, without the
# AVX-512 target attribute, its ISA switches read from the test's. A source whose text no
# longer matches fails here rather than testing something else.
file(READ "${SRC}" text)
foreach(needle "namespace ds4::quant::detail {" "}  // namespace ds4::quant::detail")
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "emulate_tile: '${needle}' not in ${SRC}")
  endif()
endforeach()
string(REPLACE "namespace ds4::quant::detail {" "namespace ds4::quant::detail::emu {" text "${text}")
string(REPLACE "}  // namespace ds4::quant::detail" "}  // namespace ds4::quant::detail::emu" text "${text}")
string(REGEX REPLACE "#define DS4_VNNI512 [^\n]*" "#define DS4_VNNI512" text "${text}")
string(REPLACE "avxvnni_enabled()" "emu_avxvnni()" text "${text}")
string(REGEX REPLACE "([^a-z_])vnni_enabled\\(\\)" "\\1emu_vnni()" text "${text}")
file(WRITE "${DST}.tmp" "${text}")
file(RENAME "${DST}.tmp" "${DST}")
