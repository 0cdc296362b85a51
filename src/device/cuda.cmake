# CUDA device memory (HIXL_WITH_CUDA): only the toolkit's headers are used;
# the driver is loaded at run time (device/cuda.h), so nothing links libcuda
# or libcudart and the library runs on hosts without a driver.
target_include_directories(hixl_core PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(hixl_core PUBLIC HIXL_HAVE_CUDA=1)
target_compile_definitions(hixl_internal PUBLIC HIXL_HAVE_CUDA=1)
target_link_libraries(hixl PRIVATE ${CMAKE_DL_LIBS})
target_link_libraries(hixl_internal PUBLIC ${CMAKE_DL_LIBS})
