# ctest prebuilt_shaders_current: each shaders/prebuilt/NAME.inc names its source and the
# source's sha256 on its first line (scripts/prebuild-shaders.sh); a source edited since
# fails here until the script is run again with a glslang that knows its extensions.
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
  message(STATUS "${inc}: current (${src})")
endforeach()
