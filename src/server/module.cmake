# The server (`anvil serve`) is a library of its own, anvil_server, over libanvil: libanvil
# does not link libmicrohttpd; the anvil command, server_test and the server's fuzz targets
# link anvil_server. Its sources are taken out of libanvil's glob here.
pkg_check_modules(MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
file(GLOB ANVIL_SERVER_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.c)
list(FILTER ANVIL_SERVER_SOURCES EXCLUDE REGEX "_test\\.c$")
list(REMOVE_ITEM ANVIL_SOURCES ${ANVIL_SERVER_SOURCES})
add_library(anvil_server STATIC ${ANVIL_SERVER_SOURCES})
target_compile_options(anvil_server PRIVATE -fvisibility=hidden)
target_link_libraries(anvil_server PUBLIC anvil_static PkgConfig::MICROHTTPD)
# its test talks HTTP through libcurl
if(ANVIL_TESTS)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
  set(ANVIL_TEST_LIBS_server_test anvil_server PkgConfig::CURL)
  set(ANVIL_TEST_LIBS_batchsrv_test anvil_server PkgConfig::CURL)
  set(ANVIL_TEST_LIBS_specsrv_test anvil_server PkgConfig::CURL)
  set(ANVIL_TEST_LIBS_toolcall_serve_test PkgConfig::CURL)
endif()
set(ANVIL_FUZZ_LIBS_fuzz_http anvil_server)
set(ANVIL_FUZZ_LIBS_fuzz_openai_request anvil_server)
