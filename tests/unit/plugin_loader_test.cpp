#include "loader/plugin_loader.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <algorithm>
#include <cstring>

#include "fake_env.hpp"

namespace hvd_test {
int clash_origin();     // tests/plugins/clash_origin.cpp
extern int clash_data;  // tests/plugins/clash_data.cpp
}  // namespace hvd_test

namespace hvd::core {
namespace {

const fs::path kTestPlugins = HVD_TEST_PLUGIN_DIR;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PluginLoader, LoadsACPluginAndReadsItsTable) {
  auto plugin = load_plugin(kTestPlugins / "libhvd-backend-kvs.so");
  ASSERT_TRUE(plugin.ok()) << plugin.status().to_string();
  EXPECT_EQ(plugin->name, "kvs");
  EXPECT_EQ(plugin->version, "1.0.0");
  EXPECT_EQ(plugin->abi_major, 1u);
  EXPECT_EQ(plugin->capabilities, HVD_CAP_HOST_MEMORY);
  // Loading again returns the same table: the library is loaded once and never unloaded.
  EXPECT_EQ(load_plugin(kTestPlugins / "libhvd-backend-kvs.so")->table, plugin->table);
}

bool sanitized() {
  return ::dlsym(RTLD_DEFAULT, "__asan_init") != nullptr ||
         ::dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr;
}

// A plugin calls the C++ symbols of the libraries it brings, not another library's definition
// the application has: PyTorch's wheels export a Gloo of their own from libtorch_cpu.so, which
// replaced the gloo plugin's and crashed it (RTLD_DEEPBIND where that happens).
TEST(PluginLoader, APluginCallsItsOwnLibrarysSymbolWhereTheApplicationDefinesItToo) {
  if (sanitized()) GTEST_SKIP() << "a sanitizer runtime refuses RTLD_DEEPBIND";
  ASSERT_EQ(hvd_test::clash_origin(), 2);  // the application's definition, loaded
  const fs::path file = kTestPlugins / "libhvd-backend-clash.so";
  const PluginLoadMode mode = plugin_load_mode(file);
  EXPECT_TRUE(mode.deep_bind());
  EXPECT_TRUE(contains(mode.clash, "_ZN8hvd_test12clash_originEv (defined by ")) << mode.clash;
  EXPECT_TRUE(contains(mode.clash, "libhvd-test-clash-origin2.so")) << mode.clash;
  auto plugin = load_plugin(file);
  ASSERT_TRUE(plugin.ok()) << plugin.status().to_string();
  EXPECT_EQ(plugin->description, "calls its own library's symbol");
}

// Not without a clash: RTLD_DEEPBIND would bind a plugin to a library's own copy of data the
// executable copied into itself (MPI_COMM_WORLD in an MPI program crashed
// integration.Mpirun.AnApplicationThatOwnsMpiKeepsIt). A C plugin has no C++ imports to clash.
TEST(PluginLoader, APluginWithoutAClashLoadsWithoutDeepBinding) {
  const PluginLoadMode mode = plugin_load_mode(kTestPlugins / "libhvd-backend-kvs.so");
  EXPECT_FALSE(mode.deep_bind());
  EXPECT_EQ(mode.clash, "");
}

// A clash, but the executable copied data of a library the plugin needs: with RTLD_DEEPBIND the
// plugin would read the library's never-initialized original, so it loads without it (and the
// loader warns that the clash stands).
TEST(PluginLoader, AClashWhereTheExecutableCopiedThePluginsLibraryDataLoadsWithoutDeepBinding) {
  ASSERT_EQ(hvd_test::clash_data, 7);
  auto self = dynamic_symbols("/proc/self/exe");
  ASSERT_TRUE(self.ok()) << self.status().to_string();
  if (sanitized()) GTEST_SKIP() << "a sanitizer runtime refuses RTLD_DEEPBIND";
  if (std::find(self->copied.begin(), self->copied.end(), "_ZN8hvd_test10clash_dataE") ==
      self->copied.end()) {
    GTEST_SKIP() << "this toolchain did not copy hvd_test::clash_data into the executable";
  }
  const fs::path file = kTestPlugins / "libhvd-backend-clashcopy.so";
  const PluginLoadMode mode = plugin_load_mode(file);
  EXPECT_FALSE(mode.deep_bind());
  EXPECT_TRUE(contains(mode.clash, "libhvd-test-clash-origin2.so")) << mode.clash;
  EXPECT_EQ(mode.unsafe, "_ZN8hvd_test10clash_dataE (from libhvd-test-clash-data.so)");
  auto plugin = load_plugin(file);
  ASSERT_TRUE(plugin.ok()) << plugin.status().to_string();
  EXPECT_EQ(plugin->version, "1.0.0");  // it reads the executable's copy, as the program does
  EXPECT_EQ(plugin->description, "calls the application's symbol");
}

// ---- the table read by its struct_size ----------------------------------------------------------

hvd_status no_init(const hvd_backend_init_args*, hvd_backend_comm**) { return HVD_ERR_INTERNAL; }
hvd_status no_finalize(hvd_backend_comm*) { return HVD_ERR_INTERNAL; }
hvd_status no_collective(hvd_backend_comm*, const hvd_collective_args*) { return HVD_ERR_INTERNAL; }
hvd_status no_barrier(hvd_backend_comm*) { return HVD_ERR_INTERNAL; }

// A table in memory laid out as its plugin would have it: `struct_size` bytes of table, then
// bytes the plugin never wrote (here 0xa5: a reader that looks past struct_size sees garbage).
struct TableInMemory {
  alignas(hvd_backend_v1) unsigned char bytes[sizeof(hvd_backend_v1) + 64];
  hvd_backend_v1* table() { return reinterpret_cast<hvd_backend_v1*>(bytes); }

  TableInMemory(size_t struct_size, uint32_t abi_minor) {
    std::memset(bytes, 0xa5, sizeof bytes);
    hvd_backend_v1 t{};
    t.struct_size = struct_size;
    t.abi_major = HVD_BACKEND_ABI_MAJOR;
    t.abi_minor = abi_minor;
    t.name = "inmemory";
    t.capabilities = HVD_CAP_HOST_MEMORY;
    t.init = no_init;
    t.finalize = no_finalize;
    t.allreduce = t.allgather = t.broadcast = no_collective;
    t.barrier = no_barrier;
    t.dtypes = HVD_DTYPES_1_0;
    t.reduce_ops = HVD_REDUCE_OPS_1_0;
    std::memcpy(bytes, &t, std::min(struct_size, sizeof t));
  }
};

TEST(PluginLoader, ATableOfAbi10IsReadWithTheDefaultsOfLaterFields) {
  TableInMemory memory(HVD_BACKEND_V1_SIZE_1_0, 0);
  auto plugin = plugin_from_table("in-memory", memory.table());
  ASSERT_TRUE(plugin.ok()) << plugin.status().to_string();
  EXPECT_EQ(plugin->abi_minor, 0u);
  EXPECT_EQ(plugin->dtypes, HVD_DTYPES_1_0);
  EXPECT_EQ(plugin->reduce_ops, HVD_REDUCE_OPS_1_0);
  EXPECT_EQ(plugin->split, nullptr);
  EXPECT_EQ(plugin->abort, nullptr);
  EXPECT_EQ(plugin->alltoall, nullptr);
  EXPECT_EQ(optional_entries_to_string(*plugin), "none");
}

TEST(PluginLoader, ATableOfALaterMinorLoadsAndOnlyWhatThisHvdKnowsIsRead) {
  TableInMemory memory(sizeof(hvd_backend_v1) + 48, 7);
  memory.table()->dtypes = HVD_DTYPE_BIT(HVD_FLOAT32) | HVD_DTYPE_BIT(40);  // 40: a later dtype
  memory.table()->reduce_ops = HVD_REDUCE_OP_BIT(HVD_MAX) | HVD_REDUCE_OP_BIT(30);
  memory.table()->abort = no_barrier;
  auto plugin = plugin_from_table("in-memory", memory.table());
  ASSERT_TRUE(plugin.ok()) << plugin.status().to_string();
  EXPECT_EQ(plugin->dtypes, HVD_DTYPE_BIT(HVD_FLOAT32));
  EXPECT_EQ(plugin->reduce_ops, HVD_REDUCE_OP_BIT(HVD_MAX));
  EXPECT_EQ(optional_entries_to_string(*plugin), "abort");
  EXPECT_EQ(dtypes_to_string(plugin->dtypes), "float32");
  EXPECT_EQ(reduce_ops_to_string(plugin->reduce_ops), "max");
}

TEST(PluginLoader, ATableThatDeclaresNoDtypeOrNoOpIsRefusedWithTheReason) {
  TableInMemory no_dtypes(sizeof(hvd_backend_v1), HVD_BACKEND_ABI_MINOR);
  no_dtypes.table()->dtypes = HVD_DTYPE_BIT(40);  // none this hvd knows
  auto plugin = plugin_from_table("in-memory", no_dtypes.table());
  ASSERT_FALSE(plugin.ok());
  EXPECT_EQ(plugin.status().code(), HVD_ERR_PLUGIN);
  EXPECT_EQ(plugin.status().message(),
            "in-memory: its table declares no dtype this hvd knows (dtypes is 1099511627776: set "
            "HVD_DTYPE_BIT of each dtype the plugin takes)");
  TableInMemory no_ops(sizeof(hvd_backend_v1), HVD_BACKEND_ABI_MINOR);
  no_ops.table()->reduce_ops = 0;
  plugin = plugin_from_table("in-memory", no_ops.table());
  ASSERT_FALSE(plugin.ok());
  EXPECT_TRUE(contains(plugin.status().message(), "declares no reduce op this hvd knows"));
  TableInMemory too_small(HVD_BACKEND_V1_SIZE_1_0 - 8, 0);
  plugin = plugin_from_table("in-memory", too_small.table());
  ASSERT_FALSE(plugin.ok());
  EXPECT_TRUE(contains(plugin.status().message(), "smaller than ABI 1.0's"));
}

TEST(PluginLoader, APluginBuiltAgainstTheAbi10HeadersLoads) {
  auto plugin = load_plugin(kTestPlugins / "libhvd-backend-kvs10.so");
  ASSERT_TRUE(plugin.ok()) << plugin.status().to_string();
  EXPECT_EQ(plugin->abi_minor, 0u);
  EXPECT_EQ(plugin->table->struct_size, HVD_BACKEND_V1_SIZE_1_0);
  EXPECT_EQ(plugin->dtypes, HVD_DTYPES_1_0);
  EXPECT_EQ(plugin->reduce_ops, HVD_REDUCE_OPS_1_0);
}

TEST(PluginLoader, SearchPathIsHvdPluginPathThenTheInstallLocation) {
  auto dirs = plugin_search_path(*Settings::read(fake_env({{"HVD_PLUGIN_PATH", "/a:/b::/c"}})));
  ASSERT_EQ(dirs.size(), 4u);
  EXPECT_EQ(dirs[0], "/a");
  EXPECT_EQ(dirs[1], "/b");
  EXPECT_EQ(dirs[2], "/c");
  EXPECT_EQ(dirs[3].filename(), "hvd");  // <libdir>/hvd of this build tree
}

TEST(PluginLoader, AFileThatIsNotALibraryIsRejectedWithTheLoaderMessage) {
  auto plugin = load_plugin(kTestPlugins / "libhvd-backend-garbage.so");
  ASSERT_FALSE(plugin.ok());
  EXPECT_EQ(plugin.status().code(), HVD_ERR_PLUGIN);
  EXPECT_TRUE(contains(plugin.status().message(), "cannot be loaded as a shared library"))
      << plugin.status().message();
  EXPECT_TRUE(contains(plugin.status().message(), "libhvd-backend-garbage.so"));
}

TEST(PluginLoader, ALibraryWithoutTheEntrySymbolIsNotAPlugin) {
  auto plugin = load_plugin(kTestPlugins / "libhvd-backend-noentry.so");
  ASSERT_FALSE(plugin.ok());
  EXPECT_EQ(plugin.status().code(), HVD_ERR_PLUGIN);
  EXPECT_TRUE(contains(plugin.status().message(),
                       "not an hvd backend plugin: it does not export hvd_backend_entry_v1"))
      << plugin.status().message();
}

TEST(PluginLoader, AnAbiMajorMismatchNamesBothVersions) {
  auto plugin = load_plugin(kTestPlugins / "libhvd-backend-abi2.so");
  ASSERT_FALSE(plugin.ok());
  EXPECT_TRUE(contains(plugin.status().message(),
                       "it was built for hvd backend ABI 2 (it exports hvd_backend_entry_v2) but "
                       "this hvd speaks ABI 1.2"))
      << plugin.status().message();
}

TEST(PluginLoader, AMissingFileIsNotFound) {
  EXPECT_EQ(load_plugin("/nonexistent/libhvd-backend-x.so").status().code(), HVD_ERR_NOT_FOUND);
}

// A directory of links to test plugins under names of the test's choosing, removed at the end.
// The test plugin directory itself also holds plugins that crash while loading (crashentry).
class PluginDir {
 public:
  explicit PluginDir(const std::vector<std::pair<std::string, std::string>>& links) {
    char name[] = "/tmp/hvd-plugin-dir.XXXXXX";
    if (::mkdtemp(name) != nullptr) path_ = name;
    for (const auto& [link, target] : links) {
      fs::create_symlink(kTestPlugins / plugin_file_name(target), path_ / plugin_file_name(link));
    }
  }
  ~PluginDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(PluginLoader, AnUnknownBackendListsWhatExistsAndWhereItLooked) {
  // Listed by their files, never loaded: the plugin that crashes while loading is named too, and
  // this process survives it. A file shadowed by an earlier directory is named once.
  PluginDir first({{"kvs", "kvs"}, {"crashentry", "crashentry"}});
  PluginDir second({{"kvs", "kvsmin"}, {"garbage", "garbage"}});
  auto plugin = resolve_backend("nope", {first.path(), "/nonexistent", second.path()});
  ASSERT_FALSE(plugin.ok());
  EXPECT_EQ(plugin.status().code(), HVD_ERR_NOT_FOUND);
  EXPECT_EQ(plugin.status().message(),
            "unknown backend 'nope': no libhvd-backend-nope.so in the plugin search path. "
            "Available backends: crashentry, kvs, garbage (named by their files, not loaded: "
            "hvd-info says which work). Searched: " +
                first.path().string() + ", /nonexistent, " + second.path().string() +
                " (HVD_PLUGIN_PATH adds directories; HVD_BACKEND may also be a file path)");
  plugin = resolve_backend("nope", {"/nonexistent"});
  ASSERT_FALSE(plugin.ok());
  EXPECT_TRUE(contains(plugin.status().message(), "Available backends: none. Searched: "))
      << plugin.status().message();
}

TEST(PluginLoader, PluginFilesAreFoundInSearchOrderAndNamedByTheNamingRule) {
  PluginDir first({{"b", "kvs"}, {"a", "kvs"}});
  PluginDir second({{"a", "kvsmin"}, {"c", "kvs"}});
  std::vector<std::string> found;
  for (const fs::path& file : find_plugin_files({first.path(), second.path()})) {
    found.push_back(file.parent_path() == first.path() ? "1:" + backend_name_of(file)
                                                       : "2:" + backend_name_of(file));
  }
  EXPECT_EQ(found, (std::vector<std::string>{"1:a", "1:b", "2:c"}));
  EXPECT_EQ(backend_name_of("/x/libhvd-backend-my.plugin.so"), "my.plugin");
}

TEST(PluginLoader, ScanReportsGoodAndBadPlugins) {
  PluginDir dir({{"failinit", "failinit"},
                 {"kvs", "kvs"},
                 {"kvs10", "kvs10"},
                 {"kvsdevice", "kvsdevice"},
                 {"kvsmin", "kvsmin"},
                 {"wrongsum", "wrongsum"},
                 {"abi2", "abi2"},
                 {"garbage", "garbage"},
                 {"noentry", "noentry"}});
  PluginScan scan = scan_plugins({dir.path()});
  std::vector<std::string> names;
  for (const Plugin& p : scan.plugins) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"failinit", "kvs", "kvs10", "kvsdevice", "kvsmin",
                                             "wrongsum"}));
  // The variants of kvs load fine (failinit fails only at init, wrongsum computes wrong sums,
  // kvsdevice claims device memory); abi2, garbage and noentry do not load.
  ASSERT_EQ(scan.failures.size(), 3u);
  EXPECT_EQ(scan.failures[0].path.filename(), "libhvd-backend-abi2.so");
  EXPECT_EQ(scan.failures[1].path.filename(), "libhvd-backend-garbage.so");
  EXPECT_EQ(scan.failures[2].path.filename(), "libhvd-backend-noentry.so");
}

TEST(PluginLoader, ResolvesAPathDirectly) {
  auto plugin = resolve_backend((kTestPlugins / "libhvd-backend-kvs.so").string(), {});
  ASSERT_TRUE(plugin.ok()) << plugin.status().to_string();
  EXPECT_EQ(plugin->name, "kvs");
}

}  // namespace
}  // namespace hvd::core
