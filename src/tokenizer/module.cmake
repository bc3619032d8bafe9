# The tokenizer needs PCRE2 (pre-tokenizer regexes, with JIT) and utf8proc (NFC).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
list(APPEND ANVIL_DEPS PkgConfig::PCRE2 PkgConfig::UTF8PROC)
