# `cmake --install BUILD [--prefix DIR]`: headers, libfsdp.a, fsdprun, and the package another
# project finds with find_package(fsdp_cpp) to link fsdp::fsdp (cmake/fsdp_cppConfig.cmake.in).
include(CMakePackageConfigHelpers)

set(FSDP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fsdp_cpp)
install(TARGETS fsdp EXPORT fsdp_cppTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/fsdp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT fsdp_cppTargets NAMESPACE fsdp:: DESTINATION ${FSDP_CMAKE_DIR})
configure_package_config_file(cmake/fsdp_cppConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/fsdp_cppConfig.cmake
                              INSTALL_DESTINATION ${FSDP_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fsdp_cppConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
# The build tree is a package too (its config above includes the targets beside it): another
# project's find_package(fsdp_cpp) with CMAKE_PREFIX_PATH=BUILD links BUILD's libfsdp.a.
export(EXPORT fsdp_cppTargets NAMESPACE fsdp:: FILE ${CMAKE_CURRENT_BINARY_DIR}/fsdp_cppTargets.cmake)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fsdp_cppConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/fsdp_cppConfigVersion.cmake
        DESTINATION ${FSDP_CMAKE_DIR})
