# cmake -DNM=<nm> -DPLUGIN=<file> -P HvdBackendEntryCheck.cmake (run by hvd_add_backend after
# the link): fail the build, and remove the file, when the plugin does not export
# hvd_backend_entry_v1, so that the mistake shows here and not when the plugin is loaded.
execute_process(COMMAND "${NM}" -D --defined-only "${PLUGIN}" RESULT_VARIABLE rc
                OUTPUT_VARIABLE symbols ERROR_QUIET)
if(NOT rc EQUAL 0)
  return()  # an nm that cannot read it: hvd-plugin-check will say more
endif()
if(NOT symbols MATCHES "[ \t]hvd_backend_entry_v1\n")
  file(REMOVE "${PLUGIN}")
  set(hint "define it as extern \"C\" HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void), or use the SDK's HVD_BACKEND_PLUGIN")
  if(symbols MATCHES "hvd_backend_entry_v1")
    set(hint "it is there under a C++ name: ${hint}")
  endif()
  message(FATAL_ERROR "${PLUGIN} does not export hvd_backend_entry_v1: ${hint}")
endif()
