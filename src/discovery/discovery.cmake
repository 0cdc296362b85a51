# etcd discovery (HIXL_WITH_ETCD): the v3 JSON gateway through libcurl.
target_sources(hixl_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/etcd_json.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd_client.cc
  ${CMAKE_CURRENT_LIST_DIR}/etcd_watch.cc
  ${CMAKE_CURRENT_LIST_DIR}/registry.cc
  ${CMAKE_CURRENT_LIST_DIR}/entry.cc)
target_compile_definitions(hixl_core PUBLIC HIXL_HAVE_ETCD=1)
target_compile_definitions(hixl_internal PUBLIC HIXL_HAVE_ETCD=1)
target_link_libraries(hixl_core PRIVATE CURL::libcurl)
target_link_libraries(hixl PRIVATE CURL::libcurl)
target_link_libraries(hixl_internal PUBLIC CURL::libcurl)
