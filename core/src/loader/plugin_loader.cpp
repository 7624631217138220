#include "loader/plugin_loader.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/auxv.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "common/log.hpp"
#include "hvd/sdk/signals.hpp"

namespace hvd::core {
namespace {

// Loaded libraries, by canonical path. Deliberately leaked: unloading a plugin while any
// pointer into it lives is undefined behaviour, and a process-lifetime registry rules it out.
struct Registry {
  std::mutex mutex;
  std::map<fs::path, boost::dll::shared_library> libraries;
};
Registry& registry() {
  static Registry* instance = new Registry;
  return *instance;
}

#if defined(__x86_64__)
constexpr uint32_t kCopyRelocation = R_X86_64_COPY;
#elif defined(__aarch64__)
constexpr uint32_t kCopyRelocation = R_AARCH64_COPY;
#else
constexpr uint32_t kCopyRelocation = ~0u;  // none recognized: no copies seen
#endif

Status plugin_error(const fs::path& file, const std::string& why) {
  return error(HVD_ERR_PLUGIN, file.string() + ": " + why);
}

// Which hvd_backend_entry_v<N> the file exports, if any: names the ABI a foreign plugin targets.
std::vector<std::string> entry_symbols_in(const fs::path& file) {
  std::vector<std::string> found;
  if (auto symbols = exported_symbols(file); symbols.ok()) {
    for (const std::string& symbol : *symbols) {
      if (symbol.rfind("hvd_backend_entry_v", 0) == 0) found.push_back(symbol);
    }
  }
  return found;
}

// Why a file lacks the entry symbol, where its symbols tell: a C++ compiler's mangled name for
// it (a definition without extern "C"), or a definition hidden by -fvisibility=hidden.
std::string missing_entry_hint(const fs::path& file) {
  if (auto symbols = exported_symbols(file); symbols.ok()) {
    for (const std::string& symbol : *symbols) {
      if (symbol != HVD_BACKEND_ENTRY_SYMBOL &&
          symbol.find(HVD_BACKEND_ENTRY_SYMBOL) != std::string::npos) {
        return " (it exports " + symbol +
               ", a C++ name: define the entry inside extern \"C\" { }, as the SDK's "
               "HVD_BACKEND_PLUGIN does)";
      }
    }
  }
  return " (define `extern \"C\" HVD_PLUGIN_EXPORT const hvd_backend_v1* " HVD_BACKEND_ENTRY_SYMBOL
         "(void)`, or use the SDK's HVD_BACKEND_PLUGIN; with -fvisibility=hidden the entry "
         "needs HVD_PLUGIN_EXPORT)";
}

Status validate_table(const fs::path& file, const hvd_backend_v1* t) {
  if (t == nullptr) return plugin_error(file, "hvd_backend_entry_v1() returned NULL");
  if (t->abi_major != HVD_BACKEND_ABI_MAJOR) {
    return plugin_error(file, "its table says ABI " + std::to_string(t->abi_major) + "." +
                                  std::to_string(t->abi_minor) + " but this hvd speaks ABI " +
                                  std::to_string(HVD_BACKEND_ABI_MAJOR) + "." +
                                  std::to_string(HVD_BACKEND_ABI_MINOR));
  }
  if (t->struct_size < HVD_BACKEND_V1_SIZE_1_0) {
    return plugin_error(file, "its table is " + std::to_string(t->struct_size) +
                                  " bytes, smaller than ABI 1.0's " +
                                  std::to_string(HVD_BACKEND_V1_SIZE_1_0));
  }
  if (t->name == nullptr || *t->name == '\0') return plugin_error(file, "its table has no name");
  if (t->init == nullptr || t->finalize == nullptr || t->allreduce == nullptr ||
      t->allgather == nullptr || t->broadcast == nullptr || t->barrier == nullptr) {
    return plugin_error(file,
                        "its table lacks a required entry point "
                        "(init, finalize, allreduce, allgather, broadcast, barrier)");
  }
  if ((t->capabilities & HVD_CAP_REDUCE_SCATTER) != 0 && t->reduce_scatter == nullptr) {
    return plugin_error(file, "it claims reduce_scatter but its entry point is NULL");
  }
  if (HVD_HAS_FIELD(t, hvd_backend_v1, dtypes) && (t->dtypes & kKnownDtypes) == 0) {
    return plugin_error(file, "its table declares no dtype this hvd knows (dtypes is " +
                                  std::to_string(t->dtypes) +
                                  ": set HVD_DTYPE_BIT of each dtype the plugin takes)");
  }
  if (HVD_HAS_FIELD(t, hvd_backend_v1, reduce_ops) && (t->reduce_ops & kKnownReduceOps) == 0) {
    return plugin_error(file, "its table declares no reduce op this hvd knows (reduce_ops is " +
                                  std::to_string(t->reduce_ops) +
                                  ": set HVD_REDUCE_OP_BIT of each op the plugin takes)");
  }
  return Status::success();
}

// Where libhvd (or the tool this loader is linked into) expects installed plugins.
//
// Whether this code is in the executable or in libhvd is told by the object's base address:
// the dynamic loader names the executable by its argv[0] as typed ("hvd-info", found through
// PATH), which says nothing of where it is, so the executable's path is /proc/self/exe's.
fs::path install_plugin_dir() {
  try {
    Dl_info here{}, program{};
    if (::dladdr(reinterpret_cast<void*>(&install_plugin_dir), &here) == 0 ||
        ::dladdr(reinterpret_cast<void*>(::getauxval(AT_PHDR)), &program) == 0) {
      return {};
    }
    const bool in_executable = here.dli_fbase == program.dli_fbase;
    const fs::path self = in_executable ? fs::path(boost::dll::program_location().string())
                                        : fs::absolute(here.dli_fname);
    return (self.parent_path() /
            (in_executable ? HVD_PLUGIN_DIR_FROM_BINDIR : HVD_PLUGIN_DIR_FROM_LIBDIR))
        .lexically_normal();
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace

hvd_dtype Plugin::byte_dtype() const {
  for (hvd_dtype d : {HVD_UINT8, HVD_INT8, HVD_INT32, HVD_INT64, HVD_FLOAT16, HVD_BFLOAT16,
                      HVD_FLOAT32, HVD_FLOAT64}) {
    if (takes(d)) return d;
  }
  return HVD_UINT8;  // unreachable: a loaded plugin declares a dtype this hvd knows
}

hvd_reduce_op Plugin::any_reduce_op() const {
  for (int op = 0; op < HVD_REDUCE_OP_COUNT; ++op) {
    if (takes(static_cast<hvd_reduce_op>(op))) return static_cast<hvd_reduce_op>(op);
  }
  return HVD_SUM;  // unreachable: a loaded plugin declares an op this hvd knows
}

// Boost.DLL's library_info reads .symtab (gone once a library is stripped) through the last
// string table of the file (usually .shstrtab, not .symtab's own), so it misnames symbols and
// reads past its buffer; .dynsym, through the string table its sh_link names, is what dlsym sees.
Result<DynamicSymbols> dynamic_symbols(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return plugin_error(file, "cannot be opened");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  auto fits = [&](uint64_t offset, uint64_t bytes) {
    return offset <= file_size && bytes <= file_size - offset;
  };
  auto read_at = [&](uint64_t offset, void* to, uint64_t bytes) {
    if (!fits(offset, bytes)) return false;
    in.seekg(static_cast<std::streamoff>(offset));
    return static_cast<bool>(in.read(static_cast<char*>(to), static_cast<std::streamsize>(bytes)));
  };
  Elf64_Ehdr header;
  if (!read_at(0, &header, sizeof header) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB ||
      header.e_shentsize != sizeof(Elf64_Shdr)) {
    return plugin_error(file, "not a 64-bit little-endian ELF file");
  }
  if (!fits(header.e_shoff, uint64_t{header.e_shnum} * sizeof(Elf64_Shdr))) {
    return plugin_error(file, "its section headers lie outside the file");
  }
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  (void)read_at(header.e_shoff, sections.data(), sections.size() * sizeof(Elf64_Shdr));
  // A section's entries, and the string table its sh_link names; sizes checked against the file
  // before anything is allocated.
  auto read_table = [&](const Elf64_Shdr& table, size_t entry_size, auto& entries,
                        std::vector<char>& text) {
    if (table.sh_link >= sections.size() || table.sh_entsize != entry_size ||
        table.sh_size % entry_size != 0 || !fits(table.sh_offset, table.sh_size)) {
      return false;
    }
    const Elf64_Shdr& strings = sections[table.sh_link];
    if (strings.sh_type != SHT_STRTAB || !fits(strings.sh_offset, strings.sh_size)) return false;
    entries.resize(table.sh_size / entry_size);
    text.resize(strings.sh_size);
    return read_at(table.sh_offset, entries.data(), table.sh_size) &&
           read_at(strings.sh_offset, text.data(), text.size());
  };
  auto name_at = [](const std::vector<char>& text, uint64_t offset) {
    return std::string(text.data() + offset, strnlen(text.data() + offset, text.size() - offset));
  };
  DynamicSymbols found;
  std::vector<Elf64_Sym> symbols;  // .dynsym, which the relocations index
  std::vector<char> symbol_names;
  for (const Elf64_Shdr& table : sections) {
    std::vector<char> text;
    if (table.sh_type == SHT_DYNSYM) {
      if (!read_table(table, sizeof(Elf64_Sym), symbols, symbol_names)) {
        return plugin_error(file, "its dynamic symbol table is malformed");
      }
      for (const Elf64_Sym& symbol : symbols) {
        const unsigned bind = ELF64_ST_BIND(symbol.st_info);
        const unsigned visibility = ELF64_ST_VISIBILITY(symbol.st_other);
        if (symbol.st_name == 0 || symbol.st_name >= symbol_names.size() ||
            (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE)) {
          continue;
        }
        if (symbol.st_shndx == SHN_UNDEF) {
          if (bind != STB_WEAK) found.imported.push_back(name_at(symbol_names, symbol.st_name));
        } else if (visibility == STV_DEFAULT || visibility == STV_PROTECTED) {
          found.exported.push_back(name_at(symbol_names, symbol.st_name));
        }
      }
    } else if (table.sh_type == SHT_DYNAMIC) {
      std::vector<Elf64_Dyn> entries;
      if (!read_table(table, sizeof(Elf64_Dyn), entries, text)) {
        return plugin_error(file, "its dynamic section is malformed");
      }
      for (const Elf64_Dyn& entry : entries) {
        if (entry.d_tag == DT_NULL) break;
        if (entry.d_tag == DT_NEEDED && entry.d_un.d_val < text.size()) {
          found.needed.push_back(name_at(text, entry.d_un.d_val));
        }
      }
    }
  }
  // Copy relocations (an executable's copies of libraries' data), by .dynsym index.
  for (const Elf64_Shdr& table : sections) {
    if (table.sh_type != SHT_RELA || table.sh_entsize != sizeof(Elf64_Rela) ||
        table.sh_size % sizeof(Elf64_Rela) != 0 || !fits(table.sh_offset, table.sh_size) ||
        table.sh_link >= sections.size() || sections[table.sh_link].sh_type != SHT_DYNSYM) {
      continue;
    }
    std::vector<Elf64_Rela> relocations(table.sh_size / sizeof(Elf64_Rela));
    if (!read_at(table.sh_offset, relocations.data(), table.sh_size)) continue;
    for (const Elf64_Rela& relocation : relocations) {
      const uint64_t index = ELF64_R_SYM(relocation.r_info);
      if (ELF64_R_TYPE(relocation.r_info) == kCopyRelocation && index < symbols.size() &&
          symbols[index].st_name < symbol_names.size()) {
        found.copied.push_back(name_at(symbol_names, symbols[index].st_name));
      }
    }
  }
  return found;
}

Result<std::vector<std::string>> exported_symbols(const fs::path& file) {
  HVD_ASSIGN_OR_RETURN(DynamicSymbols symbols, dynamic_symbols(file));
  return std::move(symbols.exported);
}

std::string plugin_file_name(const std::string& backend) {
  return HVD_BACKEND_FILE_PREFIX + backend + HVD_BACKEND_FILE_SUFFIX;
}

std::vector<fs::path> plugin_search_path(const Settings& settings) {
  std::vector<fs::path> dirs;
  if (auto path = settings.optional(Knob::kPluginPath)) {
    for (const std::string& dir : split(*path, ':')) dirs.emplace_back(dir);
  }
  const fs::path installed = install_plugin_dir();
  if (!installed.empty()) dirs.push_back(installed);
  return dirs;
}

namespace {

// The libraries of `needed` that the process has loaded already (by soname, whatever file each
// was loaded from), held open while this lives.
class LoadedLibraries {
 public:
  struct Library {
    std::string name;  // as DT_NEEDED says
    void* handle;
    const link_map* map;
  };
  explicit LoadedLibraries(const std::vector<std::string>& needed) {
    for (const std::string& name : needed) {
      void* handle = ::dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
      if (handle == nullptr) continue;
      link_map* map = nullptr;
      if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0) map = nullptr;
      libraries_.push_back({name, handle, map});
    }
  }
  ~LoadedLibraries() {
    for (const Library& library : libraries_) (void)::dlclose(library.handle);
  }
  LoadedLibraries(const LoadedLibraries&) = delete;
  LoadedLibraries& operator=(const LoadedLibraries&) = delete;

  bool holds(const link_map* map) const {
    return std::any_of(libraries_.begin(), libraries_.end(),
                       [&](const Library& library) { return library.map == map; });
  }
  const std::vector<Library>& libraries() const { return libraries_; }

 private:
  std::vector<Library> libraries_;
};

// The object that defines `address`, or nullptr.
const link_map* defined_in(const void* address) {
  if (address == nullptr) return nullptr;
#ifdef DLFO_STRUCT_HAS_EH_DBASE  // glibc 2.35: a lookup, where dladdr1 scans symbol tables
  dl_find_object found{};
  return ::_dl_find_object(const_cast<void*>(address), &found) == 0 ? found.dlfo_link_map : nullptr;
#else
  Dl_info info{};
  link_map* map = nullptr;
  return ::dladdr1(address, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0 ? map
                                                                                         : nullptr;
#endif
}

const link_map* executable() {
  void* self = ::dlopen(nullptr, RTLD_LAZY);
  if (self == nullptr) return nullptr;
  link_map* map = nullptr;
  if (::dlinfo(self, RTLD_DI_LINKMAP, &map) != 0) map = nullptr;
  (void)::dlclose(self);  // the executable's map lives as long as the process
  return map;
}

std::string name_of(const link_map* map) {
  return map->l_name != nullptr && *map->l_name != '\0' ? map->l_name : "the executable";
}

// The first C++ symbol the plugin imports that the process already defines in an object the
// plugin does not need: PyTorch's wheels link a Gloo of their own into libtorch_cpu.so and
// libtorch_cuda.so and export it, and it would bind in place of the gloo plugin's Gloo (another
// version), which then crashes. Empty when there is none. Operator new and delete are left out
// (an allocator interposed on purpose is no clash), and so is what the executable defines.
std::string foreign_definition(const DynamicSymbols& plugin, const LoadedLibraries& loaded,
                               const link_map* program) {
  for (const std::string& name : plugin.imported) {
    if (name.rfind("_Z", 0) != 0 || name.rfind("_Znw", 0) == 0 || name.rfind("_Zna", 0) == 0 ||
        name.rfind("_Zdl", 0) == 0 || name.rfind("_Zda", 0) == 0) {
      continue;
    }
    const link_map* map = defined_in(::dlsym(RTLD_DEFAULT, name.c_str()));
    if (map != nullptr && map != program && !loaded.holds(map)) {
      return name + " (defined by " + name_of(map) + ")";
    }
  }
  return {};
}

// Type information (_ZTI, and its name _ZTS), vtables (_ZTV), VTTs (_ZTT) and construction
// vtables (_ZTC): constant, so an executable's copy and the library's original are alike.
bool constant_cxx_data(const std::string& name) {
  for (const char* prefix : {"_ZTI", "_ZTS", "_ZTV", "_ZTT", "_ZTC"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Data the executable has copied into itself (copy relocations) from a library the plugin needs,
// other than the C library's: with RTLD_DEEPBIND the plugin would bind to the library's own copy,
// which is never initialized (std::cout in a C++ program, MPI_COMM_WORLD in an MPI one). Empty
// when there is none.
std::string copied_data(const LoadedLibraries& loaded) {
  auto copies = dynamic_symbols("/proc/self/exe");
  if (!copies.ok()) return "the executable's copy relocations (unreadable)";
  for (const std::string& name : copies->copied) {
    if (constant_cxx_data(name)) continue;
    for (const LoadedLibraries::Library& library : loaded.libraries()) {
      if (library.name.rfind("libc.so", 0) == 0) continue;
      // dlsym searches the library's own dependencies too: only its own definition counts.
      if (defined_in(::dlsym(library.handle, name.c_str())) == library.map) {
        return name + " (from " + library.name + ")";
      }
    }
  }
  return {};
}

}  // namespace

PluginLoadMode plugin_load_mode(const fs::path& file) {
  if (::dlsym(RTLD_DEFAULT, "__asan_init") != nullptr ||
      ::dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr) {
    return {};  // sanitizer runtimes refuse RTLD_DEEPBIND
  }
  auto symbols = dynamic_symbols(file);
  if (!symbols.ok()) return {};
  const LoadedLibraries loaded(symbols->needed);
  const link_map* program = executable();
  PluginLoadMode mode;
  mode.clash = foreign_definition(*symbols, loaded, program);
  if (mode.clash.empty()) return mode;
  mode.unsafe = copied_data(loaded);
  return mode;
}

Result<Plugin> load_plugin(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    return error(HVD_ERR_NOT_FOUND, file.string() + ": no such file");
  const fs::path canonical = fs::canonical(file, ec);
  if (ec) return plugin_error(file, ec.message());

  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.libraries.find(canonical);
  if (it == reg.libraries.end()) {
    boost::dll::shared_library library;
    // Boost.DLL's exception text wraps dlerror() in its own words and an errno that means
    // nothing here (": Bad file descriptor"): dlerror() says it all.
    boost::dll::fs::error_code load_error;
    const PluginLoadMode mode = plugin_load_mode(canonical);
    if (mode.deep_bind()) {
      log(HVD_LOG_DEBUG, canonical.filename().string() +
                             " imports symbols the process defines elsewhere, " + mode.clash +
                             ": loaded with RTLD_DEEPBIND");
    } else if (!mode.clash.empty()) {
      log(HVD_LOG_WARNING,
          canonical.filename().string() + " imports symbols the process defines elsewhere, " +
              mode.clash + ", which may replace its own; RTLD_DEEPBIND would keep them apart but " +
              "would not see the executable's copy of " + mode.unsafe);
    }
    auto flags = boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local;
    if (mode.deep_bind()) flags = flags | boost::dll::load_mode::rtld_deepbind;
    // A library the plugin loads may take the process's signals over (hvd/sdk/signals.hpp).
    const sdk::SignalDispositions before;
    library.load(canonical, flags, load_error);
    const std::string taken = before.restore_changed();
    if (!taken.empty()) {
      log(HVD_LOG_DEBUG, canonical.filename().string() + ": a library it loads caught " + taken +
                             "; hvd put the process's own handling back");
    }
    if (load_error) {
      const char* why = ::dlerror();
      return plugin_error(file, std::string("cannot be loaded as a shared library: ") +
                                    (why != nullptr ? why : load_error.message()));
    }
    it = reg.libraries.emplace(canonical, std::move(library)).first;
  }
  boost::dll::shared_library& library = it->second;

  if (!library.has(HVD_BACKEND_ENTRY_SYMBOL)) {
    for (const std::string& symbol : entry_symbols_in(canonical)) {
      const std::string major = symbol.substr(std::string("hvd_backend_entry_v").size());
      return plugin_error(file, "it was built for hvd backend ABI " + major + " (it exports " +
                                    symbol + ") but this hvd speaks ABI " +
                                    std::to_string(HVD_BACKEND_ABI_MAJOR) + "." +
                                    std::to_string(HVD_BACKEND_ABI_MINOR) +
                                    ": rebuild the plugin against this hvd's SDK");
    }
    return plugin_error(file, "not an hvd backend plugin: it does not export " +
                                  std::string(HVD_BACKEND_ENTRY_SYMBOL) +
                                  missing_entry_hint(canonical));
  }
  const auto entry = library.get<const hvd_backend_v1*()>(HVD_BACKEND_ENTRY_SYMBOL);
  HVD_ASSIGN_OR_RETURN(Plugin plugin, plugin_from_table(file, entry()));
  plugin.path = canonical;
  return plugin;
}

Result<Plugin> plugin_from_table(const fs::path& file, const hvd_backend_v1* table) {
  HVD_RETURN_IF_ERROR(validate_table(file, table));
  Plugin plugin;
  plugin.name = table->name;
  plugin.version = table->version != nullptr ? table->version : "";
  plugin.description = table->description != nullptr ? table->description : "";
  plugin.abi_major = table->abi_major;
  plugin.abi_minor = table->abi_minor;
  plugin.capabilities = table->capabilities;
  plugin.path = file;
  plugin.table = table;
  // A table from a later minor has fields this hvd does not know (never read), and may declare
  // dtypes and ops it does not know (never passed: the host rejects unknown values first).
  if (HVD_HAS_FIELD(table, hvd_backend_v1, dtypes)) plugin.dtypes = table->dtypes & kKnownDtypes;
  if (HVD_HAS_FIELD(table, hvd_backend_v1, reduce_ops)) {
    plugin.reduce_ops = table->reduce_ops & kKnownReduceOps;
  }
  if (HVD_HAS_FIELD(table, hvd_backend_v1, split)) plugin.split = table->split;
  if (HVD_HAS_FIELD(table, hvd_backend_v1, abort)) plugin.abort = table->abort;
  if (HVD_HAS_FIELD(table, hvd_backend_v1, alltoall)) plugin.alltoall = table->alltoall;
  return plugin;
}

Result<Plugin> load_plugin_by_name(const fs::path& file) {
  HVD_ASSIGN_OR_RETURN(Plugin plugin, load_plugin(file));
  const std::string expected = backend_name_of(file);
  if (plugin.name != expected) {
    return plugin_error(file, "its table says it is backend '" + plugin.name +
                                  "', but by the naming rule this file is backend '" + expected +
                                  "': HVD_BACKEND=" + expected +
                                  " finds it and refuses it. Name the file " +
                                  plugin_file_name(plugin.name) + ", or give the table the name '" +
                                  expected + "'");
  }
  return plugin;
}

std::vector<fs::path> find_plugin_files(const std::vector<fs::path>& dirs) {
  std::vector<fs::path> found;
  std::set<std::string> seen;
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(HVD_BACKEND_FILE_PREFIX, 0) == 0 && entry.path().extension() == ".so") {
        files.push_back(entry.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      if (seen.insert(file.filename().string()).second) found.push_back(file);
    }
  }
  return found;
}

std::string backend_name_of(const fs::path& file) {
  std::string name = file.filename().string();
  const std::string prefix = HVD_BACKEND_FILE_PREFIX;
  const std::string suffix = HVD_BACKEND_FILE_SUFFIX;
  if (name.rfind(prefix, 0) == 0) name.erase(0, prefix.size());
  if (name.size() >= suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.erase(name.size() - suffix.size());
  }
  return name;
}

PluginScan scan_plugins(const std::vector<fs::path>& dirs) {
  PluginScan scan;
  for (const fs::path& file : find_plugin_files(dirs)) {
    Result<Plugin> plugin = load_plugin_by_name(file);
    if (plugin.ok()) {
      scan.plugins.push_back(std::move(plugin).value());
    } else {
      scan.failures.push_back({file, plugin.status()});
    }
  }
  return scan;
}

Result<Plugin> resolve_backend(const std::string& spec, const std::vector<fs::path>& dirs) {
  if (spec.find('/') != std::string::npos) return load_plugin(spec);
  const std::string file = plugin_file_name(spec);
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    if (fs::exists(dir / file, ec)) return load_plugin_by_name(dir / file);
  }
  // Named by their files, not loaded (see plugin_loader.hpp).
  std::string available;
  for (const fs::path& found : find_plugin_files(dirs)) {
    available += (available.empty() ? "" : ", ") + backend_name_of(found);
  }
  std::string searched;
  for (const fs::path& dir : dirs) searched += (searched.empty() ? "" : ", ") + dir.string();
  return error(
      HVD_ERR_NOT_FOUND,
      "unknown backend '" + spec + "': no " + file + " in the plugin search path. " +
          "Available backends: " +
          (available.empty()
               ? "none"
               : available + " (named by their files, not loaded: hvd-info says which work)") +
          ". Searched: " + (searched.empty() ? "nothing" : searched) +
          " (HVD_PLUGIN_PATH adds directories; HVD_BACKEND may also be a file path)");
}

std::string capabilities_to_string(uint64_t capabilities) {
  static const std::pair<uint64_t, const char*> names[] = {
      {HVD_CAP_HOST_MEMORY, "host"},
      {HVD_CAP_CUDA_MEMORY, "cuda"},
      {HVD_CAP_ALLGATHERV, "allgatherv"},
      {HVD_CAP_REDUCE_SCATTER, "reduce_scatter"},
      {HVD_CAP_SELF_BOOTSTRAP, "self_bootstrap"},
  };
  std::string out;
  for (const auto& [bit, name] : names) {
    if ((capabilities & bit) != 0) out += (out.empty() ? "" : ",") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

std::string dtypes_to_string(uint64_t dtypes) {
  if ((dtypes & kKnownDtypes) == kKnownDtypes) return "all";
  std::string out;
  for (int d = 0; d < HVD_DTYPE_COUNT; ++d) {
    if ((dtypes & HVD_DTYPE_BIT(d)) != 0)
      out += (out.empty() ? "" : ",") + std::string(hvd_dtype_name(d));
  }
  return out.empty() ? "none" : out;
}

std::string reduce_ops_to_string(uint64_t reduce_ops) {
  if ((reduce_ops & kKnownReduceOps) == kKnownReduceOps) return "all";
  std::string out;
  for (int op = 0; op < HVD_REDUCE_OP_COUNT; ++op) {
    if ((reduce_ops & HVD_REDUCE_OP_BIT(op)) != 0) {
      out += (out.empty() ? "" : ",") + std::string(hvd_reduce_op_name(op));
    }
  }
  return out.empty() ? "none" : out;
}

std::string optional_entries_to_string(const Plugin& plugin) {
  std::string out;
  if (plugin.split != nullptr) out += "split";
  if (plugin.abort != nullptr) out += std::string(out.empty() ? "" : ",") + "abort";
  if (plugin.alltoall != nullptr) out += std::string(out.empty() ? "" : ",") + "alltoall";
  return out.empty() ? "none" : out;
}

}  // namespace hvd::core
