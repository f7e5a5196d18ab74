# libFuzzer targets are compiled with clang (the main build may use g++), straight from
# their sources. Each fuzzer is also a ctest test that runs for DS4_FUZZ_SECONDS.
find_program(DS4_CLANGXX NAMES clang++-14 clang++)
set(DS4_FUZZ_SECONDS 30 CACHE STRING "Seconds each fuzzer runs under ctest")

# ds4_add_fuzzer(NAME SOURCES a.cpp b.cpp [INCLUDES dirs...] [LIBS -lfoo ...] [CORPUS dir]
#                [DEFINES X=1 ...] [DEPENDS targets/files...] [RUNS n] [REGRESSIONS dir])
# RUNS: under ctest, run exactly n inputs from a fixed seed (SEED s, default 1) instead of DS4_FUZZ_SECONDS of
# random ones, so CI is reproducible for a target whose input space still hides deep finds
# (run it by hand without -runs to explore).
# REGRESSIONS: a folder of fixed finds (crash-*): a second test, NAME_regressions, runs each
# once, so a fix that regresses fails CI whatever the random runs reach.
# LIBS may name archives built by the main build ($<TARGET_FILE:lib>; list the target in
# DEPENDS too): that code is then linked in but not instrumented, so list in SOURCES the
# sources whose coverage and bounds the fuzzer is about.
function(ds4_add_fuzzer name)
  cmake_parse_arguments(F "" "CORPUS;RUNS;SEED;REGRESSIONS" "SOURCES;INCLUDES;LIBS;DEFINES;DEPENDS" ${ARGN})
  if(NOT DS4_CLANGXX)
    message(STATUS "ds4: clang++ not found, fuzzer ${name} not built")
    return()
  endif()
  set(srcs "")
  foreach(s ${F_SOURCES})
    get_filename_component(a ${s} ABSOLUTE)
    list(APPEND srcs ${a})
  endforeach()
  set(incs -I${PROJECT_SOURCE_DIR} -I${PROJECT_BINARY_DIR})
  foreach(i ${F_INCLUDES})
    list(APPEND incs -I${i})
  endforeach()
  set(defs "")
  foreach(d ${F_DEFINES})
    list(APPEND defs -D${d})
  endforeach()
  set(out ${PROJECT_BINARY_DIR}/fuzz/${name})
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/fuzz
    COMMAND ${DS4_CLANGXX} -std=c++20 -O1 -g -march=x86-64-v3 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined ${defs} ${incs} ${srcs} -o ${out} ${F_LIBS}
    DEPENDS ${srcs} ${F_DEPENDS}
    COMMENT "Building fuzzer ${name} with clang"
    VERBATIM)
  add_custom_target(${name} ALL DEPENDS ${out})
  set(corpus_dir ${PROJECT_BINARY_DIR}/fuzz/${name}.corpus)
  set(seed "")
  if(F_CORPUS)
    get_filename_component(seed ${F_CORPUS} ABSOLUTE)
  endif()
  set(budget -max_total_time=${DS4_FUZZ_SECONDS})
  if(F_RUNS)
    if(NOT F_SEED)
      set(F_SEED 1)
    endif()
    set(budget "-seed=${F_SEED} -runs=${F_RUNS}")
  endif()
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
                   sh -c "mkdir -p ${corpus_dir} && exec ${out} ${budget} -rss_limit_mb=2048 -timeout=10 ${corpus_dir} ${seed}")
  if(F_REGRESSIONS)
    get_filename_component(reg ${F_REGRESSIONS} ABSOLUTE)
    add_test(NAME ${name}_regressions
             COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
                     sh -c "exec ${out} -rss_limit_mb=2048 -timeout=10 ${reg}/crash-*")
  endif()
endfunction()
