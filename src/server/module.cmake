# server: `anvil serve` needs libmicrohttpd; its test talks HTTP through libcurl.
pkg_check_modules(MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
list(APPEND ANVIL_DEPS PkgConfig::MICROHTTPD)
if(ANVIL_TESTS)
  pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
  set(ANVIL_TEST_LIBS_server_test PkgConfig::CURL)
endif()
