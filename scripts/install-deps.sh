#!/bin/sh
# Installs what anvil needs to build and test on Debian 12 (bookworm).
set -eu
pkgs="build-essential cmake ninja-build pkg-config libcmocka-dev libcjson-dev \
libpcre2-dev libutf8proc-dev libedit-dev libvulkan-dev libvulkan-volk-dev glslc \
mesa-vulkan-drivers vulkan-validationlayers \
clang-14 libclang-rt-14-dev \
libmicrohttpd-dev libcurl4-openssl-dev \
libpng-dev libjpeg62-turbo-dev"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends $pkgs
