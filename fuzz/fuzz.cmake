# Included by the top CMakeLists.txt when ANVIL_FUZZ=ON (which compiles everything with
# -fsanitize=address,undefined, and the parsers also with -fsanitize=fuzzer-no-link).
#
# Every fuzz/fuzz_NAME.c is a libFuzzer target fuzz_NAME linked with libanvil; its seeds live
# in fuzz/corpus/fuzz_NAME/, and fuzz/dicts/fuzz_NAME.dict (optional) is its libFuzzer dictionary. ctest (label "fuzz") runs each target for a few seconds, starting
# from its seeds, writing new inputs to a scratch corpus in the build dir (never to the repo);
# the per-target time shrinks as targets are added so the whole run stays under a minute.
file(GLOB ANVIL_FUZZ_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_*.c)
list(LENGTH ANVIL_FUZZ_SOURCES anvil_n_fuzz)
set(anvil_fuzz_seconds 10)
if(anvil_n_fuzz GREATER 0)
  math(EXPR anvil_fuzz_seconds "48 / ${anvil_n_fuzz}")
  if(anvil_fuzz_seconds LESS 3)
    set(anvil_fuzz_seconds 3)
  endif()
  if(anvil_fuzz_seconds GREATER 10)
    set(anvil_fuzz_seconds 10)
  endif()
endif()
# -DANVIL_FUZZ_SECONDS=N overrides (not cached, so adding targets re-divides the minute)
if(NOT ANVIL_FUZZ_SECONDS)
  set(ANVIL_FUZZ_SECONDS ${anvil_fuzz_seconds})
endif()
foreach(src ${ANVIL_FUZZ_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_include_directories(${name} PRIVATE fuzz)
  target_compile_definitions(${name} PRIVATE ANVIL_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
  target_link_libraries(${name} PRIVATE anvil_static)
  # a module.cmake may give a target extra libraries: set(ANVIL_FUZZ_LIBS_<name> ...)
  if(ANVIL_FUZZ_LIBS_${name})
    target_link_libraries(${name} PRIVATE ${ANVIL_FUZZ_LIBS_${name}})
  endif()
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  if(ANVIL_TESTS)
    set(work ${CMAKE_CURRENT_BINARY_DIR}/fuzz-work/${name})
    file(MAKE_DIRECTORY ${work})
    set(dict ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/dicts/${name}.dict)
    if(EXISTS ${dict})
      set(dict -dict=${dict})
    else()
      set(dict "")
    endif()
    add_test(NAME ${name}
             COMMAND ${name} -max_total_time=${ANVIL_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048
                     -print_final_stats=1 ${dict}
                     ${work} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${name}
             WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(${name} PROPERTIES LABELS fuzz TIMEOUT 120 ENVIRONMENT "ANVIL_LOG=error")
  endif()
endforeach()
