# hvd_add_backend(<name> SOURCES <src>... [LIBRARIES <target>...])
#
# Builds the backend plugin libhvd-backend-<name>.so against the hvd SDK: a MODULE library
# with hidden visibility that exports only hvd_backend_entry_v1 and links with -z defs, so an
# unresolved symbol fails the link instead of the dlopen. Works in hvd's own tree and in an
# out-of-tree project after find_package(hvd).
set(HVD_BACKEND_MAP_FILE "${CMAKE_CURRENT_LIST_DIR}/hvd-backend.map" CACHE INTERNAL "")

function(hvd_add_backend name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "SOURCES;LIBRARIES")
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
endfunction()
