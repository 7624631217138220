# hvd_add_backend(<name> SOURCES <src>... [LIBRARIES <target>...] [NO_ENTRY_CHECK])
#
# Builds the backend plugin libhvd-backend-<name>.so against the hvd SDK: a MODULE library
# with hidden visibility that exports only hvd_backend_entry_v1 and links with -z defs, so an
# unresolved symbol fails the link instead of the dlopen. Works in hvd's own tree and in an
# out-of-tree project after find_package(hvd). After the link, the build fails unless the plugin
# exports hvd_backend_entry_v1 (an entry defined without extern "C" links, but is hidden by the
# version script under its C++ name); NO_ENTRY_CHECK is for hvd's tests of such plugins.
set(HVD_BACKEND_MAP_FILE "${CMAKE_CURRENT_LIST_DIR}/hvd-backend.map" CACHE INTERNAL "")
set(HVD_BACKEND_ENTRY_CHECK "${CMAKE_CURRENT_LIST_DIR}/HvdBackendEntryCheck.cmake" CACHE INTERNAL "")

function(hvd_add_backend name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "NO_ENTRY_CHECK" "" "SOURCES;LIBRARIES")
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "hvd_add_backend(${name}): SOURCES is required")
  endif()
  set(target hvd-backend-${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE hvd::sdk ${ARG_LIBRARIES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME "hvd-backend-${name}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(DEFINED HVD_PLUGIN_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${HVD_PLUGIN_OUTPUT_DIRECTORY}")
  endif()
  target_link_options(${target} PRIVATE
    "LINKER:-z,defs"
    "LINKER:--version-script=${HVD_BACKEND_MAP_FILE}")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${HVD_BACKEND_MAP_FILE}")
  if(NOT ARG_NO_ENTRY_CHECK AND CMAKE_NM)
    add_custom_command(TARGET ${target} POST_BUILD
      COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DPLUGIN=$<TARGET_FILE:${target}>
              -P "${HVD_BACKEND_ENTRY_CHECK}"
      VERBATIM)
  endif()
endfunction()
