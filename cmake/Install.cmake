# `cmake --install BUILD --prefix PREFIX`: everything a user or packager needs, in one place.
#   bin/                      ds4d, ds4 and the tools
#   lib/                      libds4.so.3 (engine + C ABI), libds4.a, libds4client.so.3
#   include/ds4/bridge, include/ds4/client   public headers (-I PREFIX/include/ds4)
#   lib/pkgconfig/            ds4.pc, ds4client.pc (relocatable: prefix from ${pcfiledir})
#   lib/cmake/ds4/            find_package(ds4): ds4::ds4, ds4::ds4_static, ds4::client
#   share/ds4/ds4.fbs         the wire protocol's schema
#   lib/systemd/user/         ds4d.service + ds4d.socket (socket activation)
#   share/man/man1/           a man page per program (help2man over --help, cmake/ManPages.cmake)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_ds4_programs ds4d ds4 ds4-gateway ds4-convert ds4-make-model ds4-requant ds4-tokenize ds4-logits ds4-bench
    ds4-bench-quant ds4-bench-daemon ds4-bench-resume ds4-bench-batch ds4-bench-gateway ds4-bench-store ds4-eval-loss
    ds4-expert-store)
foreach(_p ${_ds4_programs})
  if(TARGET ${_p})
    install(TARGETS ${_p} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

include(${PROJECT_SOURCE_DIR}/cmake/ManPages.cmake)  # share/man/man1: one page per program above

# Programs linked to libds4 find it beside them (PREFIX/lib), wherever the prefix is. (The
# others link everything statically and have no RPATH to rewrite.)
foreach(_p ds4d ds4-bench-daemon ds4-bench-resume)
  if(TARGET ${_p})
    set_target_properties(${_p} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  endif()
endforeach()

set_target_properties(ds4lib PROPERTIES EXPORT_NAME ds4)
set_target_properties(ds4client_shared PROPERTIES EXPORT_NAME client)
install(TARGETS ds4lib ds4client_shared EXPORT ds4Targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ds4)
install(FILES ${PROJECT_BINARY_DIR}/lib/libds4.a DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/bridge/ds4_bridge.h ${PROJECT_SOURCE_DIR}/bridge/ds4.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ds4/bridge)
install(FILES ${PROJECT_SOURCE_DIR}/client/ds4client.h ${PROJECT_SOURCE_DIR}/client/ds4client.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ds4/client)
install(FILES ${PROJECT_SOURCE_DIR}/ipc/ds4.fbs DESTINATION ${CMAKE_INSTALL_DATADIR}/ds4)

# pkg-config files find the prefix relative to themselves, so they are right for any
# --prefix given at install time and inside a DESTDIR staging tree.
file(RELATIVE_PATH DS4_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
foreach(_pc ds4 ds4client)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${_pc}.pc.in ${PROJECT_BINARY_DIR}/lib/pkgconfig/${_pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/lib/pkgconfig/${_pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

set(DS4_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ds4)
install(EXPORT ds4Targets NAMESPACE ds4:: DESTINATION ${DS4_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ds4Config.cmake.in ${PROJECT_BINARY_DIR}/ds4Config.cmake
                              INSTALL_DESTINATION ${DS4_CMAKE_DIR}
                              PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_DATADIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ds4ConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ds4Config.cmake ${PROJECT_BINARY_DIR}/ds4ConfigVersion.cmake
        DESTINATION ${DS4_CMAKE_DIR})

# systemd user units; the service names the installed ds4d by its absolute path, so the
# prefix is substituted when the files are installed (it may differ from configure time).
set(DS4_SYSTEMD_USER_UNIT_DIR "lib/systemd/user" CACHE STRING "Where the systemd user units go (relative: under the prefix)")
install(CODE "
  set(DS4D_BIN \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/ds4d\")
  configure_file(\"${PROJECT_SOURCE_DIR}/packaging/systemd/ds4d.service.in\" \"${PROJECT_BINARY_DIR}/packaging/ds4d.service\" @ONLY)
")
install(FILES ${PROJECT_BINARY_DIR}/packaging/ds4d.service ${PROJECT_SOURCE_DIR}/packaging/systemd/ds4d.socket
        DESTINATION ${DS4_SYSTEMD_USER_UNIT_DIR})
