// unpack_oci on OCI layouts written here with libarchive: layers applied in
// order (whiteouts, opaque directories, links, modes), the config's exec
// defaults, and one hostile layer per rule of oci_import.h, each refused
// naming its entry with nothing written outside the new root.
#include "engine/storage/oci_import.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/storage/digest.h"

namespace airlock::storage {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

struct Ent {
  Ent(std::string n, char t = 'f', std::string d = "", int m = 0644, int u = 0, int g = 0,
      std::string x = "")
      : name(std::move(n)),
        type(t),
        data(std::move(d)),
        mode(m),
        uid(u),
        gid(g),
        xattr(std::move(x)) {}
  std::string name;
  char type;         // f file, d dir, l symlink, h hard link
  std::string data;  // file content, or link target
  int mode;
  int uid, gid;
  std::string xattr;  // "name=value", or none
};

void write_layer(const fs::path& file, const std::vector<Ent>& ents, bool gzip = false) {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (gzip) archive_write_add_filter_gzip(a);
  ASSERT_EQ(archive_write_open_filename(a, file.c_str()), ARCHIVE_OK);
  for (const auto& e : ents) {
    archive_entry* en = archive_entry_new();
    archive_entry_set_pathname(en, e.name.c_str());
    archive_entry_set_perm(en, e.mode);
    archive_entry_set_uid(en, e.uid);
    archive_entry_set_gid(en, e.gid);
    if (auto eq = e.xattr.find('='); eq != std::string::npos)
      archive_entry_xattr_add_entry(en, e.xattr.substr(0, eq).c_str(), e.xattr.data() + eq + 1,
                                    e.xattr.size() - eq - 1);
    if (e.type == 'd') {
      archive_entry_set_filetype(en, AE_IFDIR);
    } else if (e.type == 'l') {
      archive_entry_set_filetype(en, AE_IFLNK);
      archive_entry_set_symlink(en, e.data.c_str());
    } else if (e.type == 'h') {
      archive_entry_set_filetype(en, AE_IFREG);
      archive_entry_set_hardlink(en, e.data.c_str());
    } else {
      archive_entry_set_filetype(en, AE_IFREG);
      archive_entry_set_size(en, static_cast<la_int64_t>(e.data.size()));
    }
    ASSERT_EQ(archive_write_header(a, en), ARCHIVE_OK) << e.name;
    if (e.type == 'f') archive_write_data(a, e.data.data(), e.data.size());
    archive_entry_free(en);
  }
  archive_write_close(a);
  archive_write_free(a);
}

class OciImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "airlock-oci-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    tmp_ = tmpl;
    fs::create_directories(tmp_ / "outside");
  }
  void TearDown() override { fs::remove_all(tmp_); }

  std::string blob(const fs::path& layout, const std::string& data) {
    fs::path f = layout / "tmp-blob";
    std::ofstream(f, std::ios::binary) << data;
    return add_blob(layout, f);
  }
  static std::string add_blob(const fs::path& layout, const fs::path& f) {
    std::string hex = sha256_file(f);
    fs::create_directories(layout / "blobs" / "sha256");
    fs::rename(f, layout / "blobs" / "sha256" / hex);
    return "sha256:" + hex;
  }

  // An OCI layout directory of `layers` and `config`.
  fs::path layout(const std::vector<std::vector<Ent>>& layers, const json& config = json::object(),
                  bool gzip = false) {
    fs::path l = tmp_ / ("layout" + std::to_string(++n_));
    fs::create_directories(l);
    std::ofstream(l / "oci-layout") << R"({"imageLayoutVersion":"1.0.0"})";
    json descs = json::array();
    for (const auto& ents : layers) {
      fs::path f = l / "tmp-layer";
      write_layer(f, ents, gzip);
      uint64_t size = fs::file_size(f);
      descs.push_back({{"digest", add_blob(l, f)}, {"size", size}});
    }
    std::string cfg = json{{"config", config}}.dump();
    json manifest = {{"schemaVersion", 2},
                     {"config", {{"digest", blob(l, cfg)}, {"size", cfg.size()}}},
                     {"layers", descs}};
    std::string m = manifest.dump();
    json index = {{"schemaVersion", 2}, {"manifests", {{{"digest", blob(l, m)}}}}};
    std::ofstream(l / "index.json") << index.dump();
    return l;
  }

  // A docker save directory: <config hex>.json, <n>/layer.tar, manifest.json;
  // rootfs.diff_ids the sha256 of each (uncompressed) layer unless `ids`.
  fs::path docker(const std::vector<std::vector<Ent>>& layers, bool gzip = false,
                  const json* ids = nullptr) {
    fs::path l = tmp_ / ("docker" + std::to_string(++n_));
    fs::create_directories(l);
    json names = json::array(), diff = json::array();
    for (size_t i = 0; i < layers.size(); ++i) {
      fs::create_directories(l / std::to_string(i));
      fs::path plain = l / "plain.tar";
      write_layer(plain, layers[i], false);
      diff.push_back("sha256:" + sha256_file(plain));
      fs::path f = l / std::to_string(i) / "layer.tar";
      if (gzip) {
        write_layer(f, layers[i], true);
        fs::remove(plain);
      } else {
        fs::rename(plain, f);
      }
      names.push_back(std::to_string(i) + "/layer.tar");
    }
    std::string cfg = json{{"config", json::object()},
                           {"rootfs", {{"type", "layers"}, {"diff_ids", ids ? *ids : diff}}}}
                          .dump();
    fs::path tmpcfg = l / "cfg";
    std::ofstream(tmpcfg) << cfg;
    std::string hex = sha256_file(tmpcfg);
    fs::rename(tmpcfg, l / (hex + ".json"));
    std::ofstream(l / "manifest.json")
        << json::array({{{"Config", hex + ".json"}, {"Layers", names}}}).dump();
    return l;
  }

  std::string refused(const fs::path& input, const ImportPolicy& policy = {}) {
    fs::path scratch = tmp_ / ("scratch" + std::to_string(++n_));
    fs::create_directories(scratch);
    try {
      unpack_oci(input, tmp_ / ("root" + std::to_string(n_)), scratch, policy);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "not refused";
    return "";
  }

  // `dir` packed into one tar (its files, paths relative to it).
  fs::path pack(const fs::path& dir, bool gzip = false) {
    fs::path out = tmp_ / ("outer" + std::to_string(++n_) + ".tar");
    std::vector<Ent> ents;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path(), std::ios::binary);
      ents.push_back({fs::relative(e.path(), dir).string(), 'f',
                      std::string(std::istreambuf_iterator<char>(in), {})});
    }
    write_layer(out, ents, gzip);
    return out;
  }

  ImportResult unpack(const fs::path& l, const ImportPolicy& policy = {}) {
    fs::path scratch = tmp_ / ("scratch" + std::to_string(n_));
    fs::create_directories(scratch);
    return unpack_oci(l, tmp_ / ("root" + std::to_string(n_)), scratch, policy);
  }

  fs::path root() const { return tmp_ / ("root" + std::to_string(n_)); }

  // The message of the Error unpacking `layers` throws (invalid_argument).
  std::string refusal(const std::vector<std::vector<Ent>>& layers, bool gzip = false) {
    try {
      unpack(layout(layers, json::object(), gzip));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "not refused";
    return "";
  }

  fs::path tmp_;
  int n_ = 0;
};

TEST_F(OciImportTest, LayersApplyInOrderWithWhiteoutsOpaqueDirsAndLinks) {
  auto r = unpack(
      layout({{{"a", 'd'}, {"a/x", 'f', "x"}, {"a/y", 'f', "y"}, {"d", 'd'}, {"d/old", 'f', "old"}},
              {{"a/.wh.x", 'f'},
               {"d/.wh..wh..opq", 'f'},
               {"d/new", 'f', "new", 0750},
               {"s", 'l', "a/y"},
               {"h", 'h', "a/y"}},
              {{"a/y", 'f', "y3"}}},
             {{"Env", {"A=1", "B=x=y"}},
              {"WorkingDir", "/w"},
              {"User", "1000"},
              {"Entrypoint", {"/bin/e"}},
              {"Cmd", {"c"}}},
             true));
  EXPECT_EQ(r.layers, 3);
  EXPECT_FALSE(fs::exists(fs::symlink_status(root() / "a" / "x")));
  EXPECT_FALSE(fs::exists(root() / "d" / "old"));
  struct stat st;
  ASSERT_EQ(::stat((root() / "d" / "new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(fs::read_symlink(root() / "s"), "a/y");
  ASSERT_EQ(::stat((root() / "h").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);  // layer 3 replaced a/y: the link keeps layer 2's file
  std::ifstream y(root() / "a" / "y");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(y), {}), "y3");
  EXPECT_EQ(r.config.env, (std::map<std::string, std::string>{{"A", "1"}, {"B", "x=y"}}));
  EXPECT_EQ(r.config.workdir, "/w");
  EXPECT_EQ(r.config.user, "1000");
  EXPECT_EQ(r.config.entrypoint, std::vector<std::string>{"/bin/e"});
  EXPECT_EQ(r.config.cmd, std::vector<std::string>{"c"});
  EXPECT_TRUE(r.source.rfind("oci:sha256:", 0) == 0) << r.source;
}

TEST_F(OciImportTest, HostileEntriesAreRefusedNamingThem) {
  std::string out = (tmp_ / "outside").string();
  std::string up = "../../../../../../../../../../" + out.substr(1) + "/p";
  EXPECT_NE(refusal({{{out + "/p", 'f', "x"}}}).find("absolute path"), std::string::npos);
  EXPECT_NE(refusal({{{up, 'f', "x"}}}).find("climbs out"), std::string::npos);
  EXPECT_NE(refusal({{{"evil", 'l', "../../x"}}}).find("'evil'"), std::string::npos);
  EXPECT_NE(refusal({{{"evil", 'h', "../x"}}}).find("'evil'"), std::string::npos);
  EXPECT_NE(refusal({{{"evil", 'h', "/etc/passwd"}}}).find("'evil'"), std::string::npos);
  EXPECT_NE(refusal({{{"sub", 'l', out}}, {{"sub/p", 'f', "x"}}}).find("sub/p"), std::string::npos);
  EXPECT_NE(refusal({{{"twice", 'f', "1"}, {"twice", 'f', "2"}}}).find("duplicate"),
            std::string::npos);
  EXPECT_NE(refusal({{{std::string(5000, 'a'), 'f', "x"}}}).find("4096"), std::string::npos);
  EXPECT_NE(
      refusal({{{"zeros", 'f', std::string(40 << 20, '\0')}}}, true).find("decompression bomb"),
      std::string::npos);
  EXPECT_TRUE(fs::is_empty(tmp_ / "outside"));
}

TEST_F(OciImportTest, ABlobNotMatchingItsDigestIsRefused) {
  fs::path l = layout({{{"f", 'f', "x"}}});
  for (const auto& e : fs::directory_iterator(l / "blobs" / "sha256")) {
    std::string head;
    std::ifstream(e.path()) >> head;
    if (head.rfind("{", 0) == 0) continue;  // config, manifest
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    std::ofstream(e.path(), std::ios::binary | std::ios::in) << "X";  // the layer: one byte off
  }
  try {
    unpack(l);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not match its digest"), std::string::npos)
        << e.what();
  }
}

TEST_F(OciImportTest, DockerSaveLayersAreCheckedAgainstTheConfigsDiffIds) {
  auto r = unpack(docker({{{"a", 'f', "1"}}, {{"b", 'f', "2"}}}, true));
  EXPECT_EQ(r.layers, 2);
  EXPECT_TRUE(r.source.rfind("docker-save:sha256:", 0) == 0) << r.source;
  r = unpack(pack(docker({{{"a", 'f', "1"}}})));  // as a tar, the way docker save writes it
  EXPECT_EQ(r.layers, 1);

  // One layer altered after the config was written.
  fs::path l = docker({{{"a", 'f', "1"}}, {{"b", 'f', "2"}}});
  write_layer(l / "1" / "layer.tar", {{"b", 'f', "evil"}});
  std::string m = refused(pack(l));
  EXPECT_NE(m.find("layer 2 (1/layer.tar) does not match its digest"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(root() / "a")) << "nothing applied before the check";

  json none = json::array();
  m = refused(docker({{{"a", 'f', "1"}}}, false, &none));
  EXPECT_NE(m.find("lists 0 rootfs.diff_ids for 1 layers"), std::string::npos) << m;
  json bad = json::array({"md5:00"});
  m = refused(docker({{{"a", 'f', "1"}}}, false, &bad));
  EXPECT_NE(m.find("not sha256"), std::string::npos) << m;

  // The config named by a digest it does not have.
  l = docker({{{"a", 'f', "1"}}});
  for (const auto& e : fs::directory_iterator(l))
    if (e.path().extension() == ".json" && e.path().filename() != "manifest.json")
      std::ofstream(e.path(), std::ios::app) << " ";
  m = refused(l);
  EXPECT_NE(m.find("does not match its digest"), std::string::npos) << m;
}

TEST_F(OciImportTest, TheOuterArchiveHasEntryAndExpansionLimits) {
  fs::path l = docker({{{"a", 'f', "1"}}});
  for (int i = 0; i < 50; ++i) std::ofstream(l / ("junk" + std::to_string(i)));
  ImportPolicy p;
  p.max_archive_entries = 20;
  std::string m = refused(pack(l), p);
  EXPECT_NE(m.find("more than 20 entries (the archive entry limit)"), std::string::npos) << m;

  // 64 MiB of zeros gzipped to ~64 KiB: far beyond 100x.
  l = docker({{{"a", 'f', "1"}}});
  {
    std::ofstream z(l / "zeros", std::ios::binary);
    std::string mib(1 << 20, '\0');
    for (int i = 0; i < 64; ++i) z << mib;
  }
  fs::path bomb = pack(l, true);
  EXPECT_LT(fs::file_size(bomb), 1u << 20);
  m = refused(bomb);
  EXPECT_NE(m.find("the expansion ratio limit"), std::string::npos) << m;
  EXPECT_NE(m.find("decompression bomb"), std::string::npos) << m;
}

}  // namespace
}  // namespace airlock::storage

namespace airlock::storage {
namespace {

uint32_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

TEST_F(OciImportTest, DeferredUnpackWritesContentsOnlyAndSettleAppliesTheRest) {
  auto r =
      unpack(layout({{{"app", 'd', "", 0750, 1000, 1000},
                      {"app/su", 'f', "s", 04755},
                      {"app/h", 'f', "h", 0640, 1000, 1001, "user.k=v\n1"},
                      {"app/l", 'h', "app/h"},
                      {"app/gone", 'f', "g", 0644, 7, 7},
                      {"d", 'd', "", 0755, 5, 5},
                      {"d/x", 'f', "x", 0600, 5, 5}},
                     {{"app/.wh.gone", 'f'}, {"d/.wh..wh..opq", 'f'}, {"d/y", 'f', "y", 0444}}}),
             {.defer = true});
  // On disk: the contents, owner-only, the importer's own.
  EXPECT_EQ(mode_of(root() / "app"), 0700u);
  EXPECT_EQ(mode_of(root() / "app" / "su"), 0600u);
  EXPECT_EQ(mode_of(root() / "d" / "y"), 0600u);
  EXPECT_FALSE(fs::exists(root() / "app" / "gone"));
  EXPECT_FALSE(fs::exists(root() / "d" / "x"));
  // The manifest: what root applies, with what later layers removed gone.
  const Manifest& m = r.manifest;
  ASSERT_TRUE(m.count("app") && m.count("app/su") && m.count("app/h") && m.count("app/l"));
  EXPECT_EQ(m.at("app").kind, 'd');
  EXPECT_EQ(m.at("app").uid, 1000u);
  EXPECT_EQ(m.at("app").mode, 0750u);
  EXPECT_EQ(m.at("app/su").mode, 04755u);
  EXPECT_EQ(m.at("app/h").gid, 1001u);
  ASSERT_EQ(m.at("app/h").xattrs.size(), 1u);
  EXPECT_EQ(m.at("app/h").xattrs[0], (std::pair<std::string, std::string>{"user.k", "v\n1"}));
  EXPECT_EQ(m.at("app/l").mode, 0640u);  // one inode, one metadata
  EXPECT_FALSE(m.count("app/gone"));
  EXPECT_FALSE(m.count("d/x"));
  EXPECT_EQ(m.at("d/y").mode, 0444u);

  // Through the manifest's own format, as the daemon receives it.
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  write_manifest(m, p[1]);
  ::close(p[1]);
  Manifest back = read_manifest(p[0], 100);
  ::close(p[0]);
  ASSERT_EQ(back.size(), m.size());

  struct stat st {};
  ASSERT_EQ(::stat(root().c_str(), &st), 0);
  uint64_t dropped = settle_import(root(), back, ::geteuid() == 0 ? st.st_uid : -1);
  EXPECT_EQ(mode_of(root()), 0755u);
  EXPECT_EQ(mode_of(root() / "app"), 0750u);
  EXPECT_EQ(mode_of(root() / "app" / "su"), 04755u);
  EXPECT_EQ(mode_of(root() / "app" / "l"), 0640u);
  EXPECT_EQ(mode_of(root() / "d" / "y"), 0444u);
  char v[16] = {};
  ssize_t n = ::lgetxattr((root() / "app" / "h").c_str(), "user.k", v, sizeof v);
  if (n < 0) {
    EXPECT_EQ(dropped, 1u);  // a filesystem without user xattrs: counted, not lost silently
  } else {
    EXPECT_EQ(std::string(v, static_cast<size_t>(n)), "v\n1");
  }
  if (::geteuid() == 0) {
    ASSERT_EQ(::stat((root() / "app" / "h").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 1000u);
    EXPECT_EQ(st.st_gid, 1001u);
    ASSERT_EQ(::stat((root() / "app" / "su").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 0u);
  }
}

TEST_F(OciImportTest, SettleNeverTouchesAnInodeTheImporterDidNotMake) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (chown to another uid)";
  const uid_t importer = 4343;
  fs::path r = tmp_ / "tree";
  fs::create_directories(r / "sub");
  std::ofstream(r / "sub" / "mine") << "x";
  std::ofstream(tmp_ / "outside" / "host") << "secret";
  ::chmod((tmp_ / "outside" / "host").c_str(), 0600);
  // A hard link to a file of the host's, as a hostile importer would leave.
  fs::create_hard_link(tmp_ / "outside" / "host", r / "sub" / "link");
  for (const auto& p : {r, r / "sub", r / "sub" / "mine"}) ::lchown(p.c_str(), importer, importer);
  Manifest m;
  m["sub/link"] = EntryMeta{'f', 0, 0, 04777, {}};
  try {
    settle_import(r, m, importer);
    ADD_FAILURE() << "settled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("'sub/link' was not made by the import"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(mode_of(tmp_ / "outside" / "host"), 0600u);

  // A device node: the importer never makes one (it could not open it, but
  // root would).
  fs::remove(r / "sub" / "link");
  ::lchown((r / "sub" / "mine").c_str(), importer, importer);  // settled before the refusal
  ASSERT_EQ(::mknod((r / "sub" / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  ::lchown((r / "sub" / "null").c_str(), importer, importer);
  try {
    settle_import(r, {}, importer);
    ADD_FAILURE() << "settled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device node"), std::string::npos) << e.what();
  }
  // A manifest entry of another kind than what is there.
  fs::remove(r / "sub" / "null");
  ::lchown((r / "sub" / "mine").c_str(), importer, importer);
  Manifest lie;
  lie["sub/mine"] = EntryMeta{'d', 0, 0, 0755, {}};
  EXPECT_THROW(settle_import(r, lie, importer), Error);
}

TEST_F(OciImportTest, AMalformedManifestIsRefusedNamingItsLine) {
  auto read = [&](const std::string& text, uint64_t max = 10) {
    fs::path f = tmp_ / "manifest";
    std::ofstream(f, std::ios::binary | std::ios::trunc) << text;
    int fd = ::open(f.c_str(), O_RDONLY);
    try {
      read_manifest(fd, max);
    } catch (const Error& e) {
      ::close(fd);
      return std::string(e.what());
    }
    ::close(fd);
    return std::string("accepted");
  };
  // A path with a space, a newline and a byte that is no UTF-8 round-trips.
  Manifest m;
  m[std::string("a b\n\xff", 5)] = EntryMeta{'f', 1, 2, 04711, {{"user.x", std::string("\0z", 2)}}};
  fs::path f = tmp_ / "m";
  int fd = ::open(f.c_str(), O_WRONLY | O_CREAT, 0600);
  write_manifest(m, fd);
  ::close(fd);
  fd = ::open(f.c_str(), O_RDONLY);
  Manifest back = read_manifest(fd, 10);
  ::close(fd);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back.begin()->first, std::string("a b\n\xff", 5));
  EXPECT_EQ(back.begin()->second.mode, 04711u);
  EXPECT_EQ(back.begin()->second.xattrs[0].second, std::string("\0z", 2));

  EXPECT_EQ(read("61 f 0 0 644\n"), "accepted");
  EXPECT_NE(read("zz f 0 0 644\n").find("line 1: bad path"), std::string::npos);
  EXPECT_NE(read("61 f 0 0 644\n62 c 0 0 644\n").find("line 2: bad kind"), std::string::npos);
  EXPECT_NE(read("61 f 0 0 17777\n").find("out of range"), std::string::npos);
  EXPECT_NE(read("61 f 0 0 648\n").find("bad number"), std::string::npos);
  EXPECT_NE(read("61 f 4294967296 0 644\n").find("line 1"), std::string::npos);
  EXPECT_NE(read("61 f 0 0 644\n61 d 0 0 755\n").find("duplicate"), std::string::npos);
  EXPECT_NE(read("61 f 0 0 644").find("no newline"), std::string::npos);
  EXPECT_NE(read("61 f 0 0 644 7a\n").find("bad xattr"), std::string::npos);
  EXPECT_NE(read("61 f 0 0 644\n62 f 0 0 644\n", 1).find("more than 1 entries"), std::string::npos);
  EXPECT_NE(read(std::string(9 << 20, 'a')).find("longer than 8 MiB"), std::string::npos);
}

}  // namespace
}  // namespace airlock::storage
