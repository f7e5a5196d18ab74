# build/ds4_version.h: the version, git revision and backends every binary's --version prints.
# The revision is taken when CMake configures (re-run cmake to refresh it after committing).
set(DS4_GIT_REVISION "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${PROJECT_SOURCE_DIR} describe --always --dirty --abbrev=12
                  OUTPUT_VARIABLE _rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND _rev)
    set(DS4_GIT_REVISION "${_rev}")
  endif()
endif()
set(DS4_BACKENDS "cpu")
if(DS4_HAVE_CUDA)
  string(APPEND DS4_BACKENDS " cuda")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/ds4_version.h.in ${PROJECT_BINARY_DIR}/ds4_version.h @ONLY)
