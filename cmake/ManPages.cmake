# Man pages for the installed programs, generated at build time from each program's --help
# and --version by help2man (Debian package help2man), installed under share/man/man1.
# Included from Install.cmake after _ds4_programs is set.
option(DS4_MAN_PAGES "Generate and install man pages with help2man" ON)
if(NOT DS4_MAN_PAGES)
  return()
endif()
find_program(DS4_HELP2MAN help2man)
if(NOT DS4_HELP2MAN)
  message(FATAL_ERROR "help2man not found: install it (scripts/setup.sh does: apt-get install help2man) "
                      "or configure with -DDS4_MAN_PAGES=OFF")
endif()

# The NAME line of each page: what the program is for.
set(_ds4_man_desc_ds4d "the ds4 inference daemon (Unix socket, sessions, continuous batching)")
set(_ds4_man_desc_ds4 "client command of ds4d: run, chat, stats, tokenize, sessions")
set(_ds4_man_desc_ds4-gateway "OpenAI- and Anthropic-compatible HTTP front on ds4d")
set(_ds4_man_desc_ds4-convert "convert a transformers DeepSeek-V4 checkpoint to GGUF")
set(_ds4_man_desc_ds4-make-model "write deterministic random or scripted DeepSeek-V4 test models")
set(_ds4_man_desc_ds4-requant "re-encode a GGUF model's matrices in another tensor type")
set(_ds4_man_desc_ds4-tokenize "tokenize or detokenize text with a model's tokenizer")
set(_ds4_man_desc_ds4-logits "per-position logits of a token sequence (parity checks)")
set(_ds4_man_desc_ds4-bench "single-stream decode benchmark: tok/s, bytes per token, bandwidth")
set(_ds4_man_desc_ds4-bench-quant "quantized dot-product kernel benchmark")
set(_ds4_man_desc_ds4-bench-daemon "ds4d overhead against the in-process bridge")
set(_ds4_man_desc_ds4-bench-resume "resume from the session store against re-prefill")
set(_ds4_man_desc_ds4-bench-batch "continuous batching throughput and latency of ds4d")
set(_ds4_man_desc_ds4-bench-gateway "per-token overhead of the HTTP front against the socket client")
set(_ds4_man_desc_ds4-bench-store "session store save/restore bandwidth")
set(_ds4_man_desc_ds4-eval-loss "mean next-token loss and argmax agreement over token rows")
set(_ds4_man_desc_ds4-expert-store "list and compact the expert store of SSD expert streaming")

set(_ds4_man_pages)
foreach(_p ${_ds4_programs})
  if(NOT TARGET ${_p})
    continue()
  endif()
  set(_desc "${_ds4_man_desc_${_p}}")
  if(NOT _desc)
    set(_desc "a ds4 program")
  endif()
  set(_page ${PROJECT_BINARY_DIR}/man/man1/${_p}.1)
  add_custom_command(OUTPUT ${_page}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man/man1
    COMMAND ${DS4_HELP2MAN} --no-info --no-discard-stderr --section=1 --name=${_desc} --output=${_page} $<TARGET_FILE:${_p}>
    DEPENDS ${_p}
    COMMENT "man page ${_p}.1"
    VERBATIM)
  list(APPEND _ds4_man_pages ${_page})
endforeach()
add_custom_target(ds4_man_pages ALL DEPENDS ${_ds4_man_pages})
install(FILES ${_ds4_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
