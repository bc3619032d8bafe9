# ctest prebuilt_shaders_current: each shaders/prebuilt/NAME.inc names its source and the
# source's sha256 on its first line (scripts/prebuild-shaders.sh); a source edited since
# fails here until the script is run again with a glslang that knows its extensions. A source
# that includes files ("...") records the sha256 of their sha256s too (a line each, each file's
# own includes after it, depth first): an edited include fails alike.

# the sha256s of the files f includes, a line each, depth first, appended to the variable out
function(include_sums f out)
  get_filename_component(d ${f} DIRECTORY)
  file(STRINGS ${f} lines REGEX "^[ \t]*#include \"")
  set(acc "${${out}}")
  foreach(l ${lines})
    string(REGEX REPLACE "^[^\"]*\"([^\"]+)\".*$" "\\1" i "${l}")
    file(SHA256 ${d}/${i} h)
    string(APPEND acc "${h}\n")
    include_sums(${d}/${i} acc)
  endforeach()
  set(${out} "${acc}" PARENT_SCOPE)
endfunction()

file(GLOB incs ${DIR}/prebuilt/*.inc)
if(NOT incs)
  message(FATAL_ERROR "no prebuilt shaders in ${DIR}/prebuilt")
endif()
foreach(inc ${incs})
  file(STRINGS ${inc} head LIMIT_COUNT 1)
  if(NOT head MATCHES "^/\\* [^:]+: ([^ ]+) .* source sha256 ([0-9a-f]+) \\*/$")
    message(FATAL_ERROR "${inc}: no source line")
  endif()
  set(src ${CMAKE_MATCH_1})
  set(want ${CMAKE_MATCH_2})
  file(SHA256 ${DIR}/${src} have)
  if(NOT have STREQUAL want)
    message(FATAL_ERROR "${inc} is stale: ${src} changed (sha256 ${have}, built from ${want}); "
                        "run GLSLANG=/path/to/glslang scripts/prebuild-shaders.sh")
  endif()
  if(head MATCHES " includes sha256 ([0-9a-f]+)")
    set(want ${CMAKE_MATCH_1})
    set(sums "")
    include_sums(${DIR}/${src} sums)
    string(SHA256 have "${sums}")
    if(NOT have STREQUAL want)
      message(FATAL_ERROR "${inc} is stale: a file ${src} includes changed; "
                          "run GLSLANG=/path/to/glslang scripts/prebuild-shaders.sh")
    endif()
  endif()
  message(STATUS "${inc}: current (${src})")
endforeach()
