# Debian packages of an installed hixl, built with CPack from a build tree:
#
#   cmake --build build && (cd build && cpack -G DEB)   ->  build/packages/*.deb
#
#   hixl           the shared libraries libhixl and libllm_datadist, and the
#                  programs (hixl-info, hixl-bench, hixl-kv-bench, hixl-pd-demo)
#   hixl-dev       headers, the CMake package (find_package(hixl)), hixl.pc and
#                  llm_datadist.pc, the unversioned library links
#   python3-hixl   the Python packages hixl and llm_datadist (when the build has
#                  HIXL_BUILD_PYTHON), for Debian's /usr/bin/python3
#
# They install under /usr (sudo apt-get install ./build/packages/*.deb). The
# install rules name these components: runtime, dev, python.

set(CPACK_PACKAGE_NAME hixl)
set(CPACK_PACKAGE_VENDOR "hixl")
set(CPACK_PACKAGE_CONTACT "hixl maintainers <hixl@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "one-sided transfers of KV caches between inference processes")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
if(HIXL_BUILD_PYTHON)
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://localhost/hixl")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME hixl)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
    "one-sided transfers of KV caches between inference processes
 The hixl engine (shared memory, tcp and UCX transports, etcd discovery) and
 LLM-DataDist, its KV-cache layer: libhixl, libllm_datadist and the programs
 hixl-info, hixl-bench, hixl-kv-bench and hixl-pd-demo.")
# dpkg-shlibdeps finds what the libraries and programs link (libc, libstdc++,
# OpenSSL, libcurl, UCX).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME hixl-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "hixl (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "hixl development files
 Headers of the hixl engine (C++ and C) and of LLM-DataDist, the CMake package
 (find_package(hixl)) and the pkg-config files hixl.pc and llm_datadist.pc.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-hixl)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
# The extension modules are built for this interpreter's version only.
# (HIXL_PYTHON_DEB_DEPENDS: set by python/CMakeLists.txt.)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "hixl (= ${PROJECT_VERSION}), ${HIXL_PYTHON_DEB_DEPENDS}")
set(CPACK_DEBIAN_PYTHON_DESCRIPTION
    "Python modules hixl and llm_datadist
 The hixl engine and LLM-DataDist (the published Python API) for Debian's
 python3.")

include(CPack)
