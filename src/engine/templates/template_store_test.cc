// The template store without VMs: keys, publication and every integrity
// check find() makes before a template may be cloned.
#include "engine/templates/template_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "common/error.h"
#include "engine/storage/image_store.h"

namespace airlock::templates {
namespace {

namespace fs = std::filesystem;

class TemplateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/altplXXXXXX";
    root_ = ::mkdtemp(tmpl);
    base_ = root_ / "base.raw";
    std::ofstream(base_, std::ios::binary).write(std::string(1 << 20, 'b').data(), 1 << 20);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Publishes a template whose "RAM" and "state" are plain files of the
  // right sizes (what a real build writes there is tested with VMs).
  Template publish(TemplateStore& store, const std::string& key, int memory_mb = 64) {
    Staging st = store.stage(key);
    storage::create_overlay(base_, st.disk, 16);
    std::ofstream(st.state, std::ios::binary) << std::string(300000, 's');
    {
      std::ofstream ram(st.ram, std::ios::binary);
      ram.seekp((int64_t{memory_mb} << 20) - 1);
      ram.put('\0');
    }
    Template meta;
    meta.image = "minimal";
    meta.image_key = "img1";
    meta.accel = "tcg";
    meta.shape = {1, memory_mb, 16, false};
    return store.commit(st, meta);
  }

  fs::path root_;
  fs::path base_;
};

TEST(TemplateKey, ChangesWithEveryInput) {
  Shape s{1, 256, 1024, false};
  std::string k = TemplateStore::key_for("img", s, "tcg", "qemu 7.2");
  EXPECT_EQ(k.size(), 16u);
  EXPECT_EQ(k, TemplateStore::key_for("img", s, "tcg", "qemu 7.2"));
  EXPECT_NE(k, TemplateStore::key_for("img2", s, "tcg", "qemu 7.2"));
  EXPECT_NE(k, TemplateStore::key_for("img", s, "kvm", "qemu 7.2"));
  EXPECT_NE(k, TemplateStore::key_for("img", s, "tcg", "qemu 8.0"));
  for (Shape o : {Shape{2, 256, 1024, false}, Shape{1, 512, 1024, false},
                  Shape{1, 256, 2048, false}, Shape{1, 256, 1024, true}})
    EXPECT_NE(k, TemplateStore::key_for("img", o, "tcg", "qemu 7.2"));
  // The QEMU identity names the version and the binary itself.
  std::string q = TemplateStore::qemu_identity("qemu-system-x86_64");
  EXPECT_NE(q.find("QEMU"), std::string::npos) << q;
  EXPECT_NE(q.find("/qemu-system-x86_64"), std::string::npos) << q;
}

TEST_F(TemplateStoreTest, PublishedTemplateIsFoundWithItsFiles) {
  TemplateStore store(root_ / "t", root_ / "ram");
  Template t = publish(store, "k1");
  std::string why;
  auto found = store.find("k1", &why);
  ASSERT_TRUE(found) << why;
  EXPECT_TRUE(why.empty());
  EXPECT_EQ(found->shape, (Shape{1, 64, 16, false}));
  EXPECT_EQ(found->state_bytes, 300000u);
  EXPECT_TRUE(fs::exists(found->clone));
  EXPECT_EQ(found->ram, root_ / "ram" / "k1.ram");
  EXPECT_FALSE(store.find("other", &why));
  EXPECT_TRUE(why.empty());  // absent is not an error
  // No staging leftovers after a publish.
  for (auto& e : fs::directory_iterator(root_ / "t"))
    EXPECT_FALSE(e.path().filename().string().starts_with(".staging")) << e.path();
}

TEST_F(TemplateStoreTest, WrittenRamFileIsRejectedAndRemoved) {
  TemplateStore store(root_ / "t", root_ / "ram");
  Template t = publish(store, "k1");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::fstream ram(t.ram, std::ios::binary | std::ios::in | std::ios::out);
    ram.seekp(4096);
    ram.put('X');  // what a clone that escaped MAP_PRIVATE would do
  }
  std::string why;
  EXPECT_FALSE(store.find("k1", &why));
  EXPECT_NE(why.find("RAM file was modified"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(t.dir));
  EXPECT_FALSE(fs::exists(t.ram));
}

TEST_F(TemplateStoreTest, MissingRamTruncatedOrCorruptStateIsRejected) {
  TemplateStore store(root_ / "t", root_ / "ram");
  std::string why;

  Template a = publish(store, "a");
  fs::remove(a.ram);  // e.g. tmpfs emptied by a host reboot
  EXPECT_FALSE(store.find("a", &why));
  EXPECT_NE(why.find("RAM file"), std::string::npos) << why;
  EXPECT_NE(why.find("missing"), std::string::npos) << why;

  Template b = publish(store, "b");
  ::chmod(b.state.c_str(), 0644);
  fs::resize_file(b.state, 1000);
  EXPECT_FALSE(store.find("b", &why));
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;

  Template c = publish(store, "c");
  ::chmod(c.state.c_str(), 0644);
  {
    std::fstream f(c.state, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(100);
    f.put('!');  // same size, different bytes
  }
  EXPECT_FALSE(store.find("c", &why));
  EXPECT_NE(why.find("SHA-256"), std::string::npos) << why;

  Template d = publish(store, "d");
  fs::remove(d.dir / "template.json");
  EXPECT_FALSE(store.find("d", &why));
  EXPECT_NE(why.find("interrupted"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(d.dir));
}

TEST_F(TemplateStoreTest, InterruptedBuildsAreCleanedAndPruneKeepsTheNewest) {
  {
    TemplateStore store(root_ / "t", root_ / "ram");
    Staging st = store.stage("x");
    std::ofstream(st.ram) << "partial";
    (void)st;  // "crash" here
  }
  TemplateStore store(root_ / "t", root_ / "ram");
  EXPECT_TRUE(fs::is_empty(root_ / "t"));
  EXPECT_TRUE(fs::is_empty(root_ / "ram"));

  publish(store, "old");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  publish(store, "mid");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  publish(store, "new");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  store.touch("old");  // used most recently
  auto removed = store.prune(2);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], "mid");
  std::string why;
  EXPECT_TRUE(store.find("old", &why)) << why;
  EXPECT_TRUE(store.find("new", &why)) << why;
  EXPECT_FALSE(fs::exists(root_ / "ram" / "mid.ram"));
}

// The RAM directory is the daemon's own: made 0700 by the store,
// and a directory that is a symlink, too open, or someone else's is refused
// at start and before each use, naming the path and the fault.
std::string refusal(const fs::path& tpl, const fs::path& ram) {
  try {
    TemplateStore store(tpl, ram);
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "template_ram_dir");
    return e.what();
  }
  return "";
}

TEST_F(TemplateStoreTest, RamDirIsCreatedOwnedAndPrivate) {
  TemplateStore store(root_ / "tpl", root_ / "ram");
  struct stat st {};
  ASSERT_EQ(::lstat((root_ / "ram").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

TEST_F(TemplateStoreTest, RamDirThatIsASymlinkIsRefused) {
  fs::create_directory(root_ / "elsewhere");
  ::chmod((root_ / "elsewhere").c_str(), 0700);
  fs::create_directory_symlink(root_ / "elsewhere", root_ / "ram");
  std::string why = refusal(root_ / "tpl", root_ / "ram");
  EXPECT_NE(why.find((root_ / "ram").string()), std::string::npos) << why;
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
}

TEST_F(TemplateStoreTest, RamDirWithWrongModeIsRefusedNotRepaired) {
  fs::create_directory(root_ / "ram");
  ::chmod((root_ / "ram").c_str(), 0777);
  std::string why = refusal(root_ / "tpl", root_ / "ram");
  EXPECT_NE(why.find("mode 0777"), std::string::npos) << why;
  struct stat st {};
  ASSERT_EQ(::stat((root_ / "ram").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0777u);  // not silently adopted
}

TEST_F(TemplateStoreTest, RamDirThatIsAFileIsRefused) {
  std::ofstream(root_ / "ram") << "x";
  EXPECT_NE(refusal(root_ / "tpl", root_ / "ram").find("not a directory"), std::string::npos);
}

TEST_F(TemplateStoreTest, RamDirOwnedBySomeoneElseIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a directory another uid owns";
  fs::create_directory(root_ / "ram");
  ::chmod((root_ / "ram").c_str(), 0700);
  ASSERT_EQ(::chown((root_ / "ram").c_str(), 4242, 4242), 0);
  std::string why = refusal(root_ / "tpl", root_ / "ram");
  EXPECT_NE(why.find("owned by uid 4242"), std::string::npos) << why;
}

TEST_F(TemplateStoreTest, RamDirIsCheckedBeforeEveryUse) {
  TemplateStore store(root_ / "tpl", root_ / "ram");
  ::chmod((root_ / "ram").c_str(), 0755);  // loosened after start
  EXPECT_THROW(store.stage("k1"), Error);
  EXPECT_THROW(store.prune(1), Error);
}

}  // namespace
}  // namespace airlock::templates
