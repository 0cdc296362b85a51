# The UCX transport (HIXL_WITH_UCX): UCP put/get over whatever UCX reaches
# (RDMA verbs, shared memory, cma, tcp).
target_sources(hixl_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/ucx_worker.cc
  ${CMAKE_CURRENT_LIST_DIR}/ucx_channel.cc
  ${CMAKE_CURRENT_LIST_DIR}/ucx_transport.cc)
target_compile_definitions(hixl_core PUBLIC HIXL_HAVE_UCX=1)
target_compile_definitions(hixl_internal PUBLIC HIXL_HAVE_UCX=1)
target_link_libraries(hixl_core PRIVATE PkgConfig::UCX)
target_link_libraries(hixl PRIVATE PkgConfig::UCX)
target_link_libraries(hixl_internal PUBLIC PkgConfig::UCX)
