# Image input decodes PNG with libpng and JPEG with libjpeg-turbo (Debian: libpng-dev,
# libjpeg62-turbo-dev).
pkg_check_modules(PNG REQUIRED IMPORTED_TARGET libpng)
pkg_check_modules(JPEG REQUIRED IMPORTED_TARGET libjpeg)
list(APPEND ANVIL_DEPS PkgConfig::PNG PkgConfig::JPEG)
