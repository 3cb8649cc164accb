#include "checkpoint/files.h"

#include "check.h"
#include "checkpoint/zip.h"
#include "hash_bytes.h"

#include <stepwise/checkpoint.h>
#include <stepwise/errors.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <typeinfo>
#include <vector>

namespace stepwise {

namespace fs = std::filesystem;

std::vector<std::string> checkpoint_tags(const std::string& dir) {
  std::vector<std::string> tags;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // partial folders of killed saves
    if (fs::exists(entry.path() / detail::kModelStatesFile) ||
        fs::exists(entry.path() / detail::kDeepSpeedFile)) {
      tags.push_back(name);
    }
  }
  std::sort(tags.begin(), tags.end());
  return tags;
}

namespace detail {

namespace {

std::string tags_present(const std::string& dir) {
  const auto tags = checkpoint_tags(dir);
  if (tags.empty()) return "no checkpoint is in " + dir;
  std::string out = "the tags in " + dir + " are:";
  for (const auto& t : tags) out += " " + t;
  return out;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_bytes(const std::string& path, const char* data, size_t size) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(data, static_cast<std::streamsize>(size));
    out.flush();
    STEPWISE_CHECK(out.good(), CheckpointError, "cannot write checkpoint file ", path, ": ",
                   std::strerror(errno));
  }
  fsync_path(path, false);
}

}  // namespace

const c10::IValue& entry(const c10::impl::GenericDict& dict, const char* key,
                         const std::string& path) {
  const auto it = dict.find(c10::IValue(std::string(key)));
  STEPWISE_CHECK(it != dict.end(), CheckpointError, "checkpoint file ", path, " has no \"", key,
                 "\" entry: it was not written by stepwise's save_checkpoint (or "
                 "tools/deepspeed-to-stepwise)");
  return it->value();
}

std::string optimizer_type(const torch::optim::Optimizer& optimizer) {
  return c10::demangle(typeid(optimizer).name());
}

std::string window_file(int64_t rank) { return c10::str("window_rank_", rank, ".pt"); }

std::string zero_shard_file(int64_t rank) {
  return c10::str("zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt");
}

void check_tag(const std::string& tag) {
  // A folder name holds at most NAME_MAX (255) bytes, and a save writes `.<tag>.partial`.
  constexpr size_t kMaxTag = 255 - std::char_traits<char>::length("..partial");
  const bool control = std::any_of(tag.begin(), tag.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == '\x7f';
  });
  const bool ok = !tag.empty() && tag.size() <= kMaxTag && !control &&
                  tag.find('/') == std::string::npos && tag != "latest" && tag[0] != '.';
  const std::string shown = tag.size() <= 60 ? tag : tag.substr(0, 40) + "...";
  STEPWISE_CHECK(ok, CheckpointError, "checkpoint tag \"", shown, "\" (", tag.size(),
                 " bytes) cannot name a folder: use a non-empty name of at most ", kMaxTag,
                 " bytes, without '/' or control characters, that does not start with '.' and is "
                 "not \"latest\" (the default is \"global_step<N>\")");
}

std::string read_latest(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  std::string tag;
  STEPWISE_CHECK(in && std::getline(in, tag) && !tag.empty(), CheckpointError, "no file ",
                 (fs::path(dir) / "latest").string(),
                 " names the checkpoint to load: pass LoadOptions().tag(...); ", tags_present(dir));
  return tag;
}

void write_latest(const std::string& dir, const std::string& tag) {
  const std::string tmp = (fs::path(dir) / ".latest.partial").string();
  const std::string line = tag + "\n";
  write_bytes(tmp, line.data(), line.size());
  std::error_code ec;
  fs::rename(tmp, fs::path(dir) / "latest", ec);
  STEPWISE_CHECK(!ec, CheckpointError, "cannot replace ", (fs::path(dir) / "latest").string(), ": ",
                 ec.message());
  fsync_path(dir, true);
}

bool remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  const auto remove_one = [](const char* entry, const struct stat*, int, struct FTW*) {
    return ::remove(entry) == 0 ? 0 : -1;
  };
  return ::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

std::string partial_folder(const std::string& dir, const std::string& tag) {
  return (fs::path(dir) / ("." + tag + ".partial")).string();
}

void make_partial_folder(const std::string& partial) {
  remove_tree(partial);
  std::error_code ec;
  fs::create_directories(partial, ec);
  STEPWISE_CHECK(!ec, CheckpointError, "cannot create checkpoint folder ", partial, ": ",
                 ec.message());
}

void publish(const std::string& partial, const std::string& dir, const std::string& tag) {
  fsync_path(partial, true);
  const fs::path target = fs::path(dir) / tag;
  if (fs::exists(target)) {
    // Swap the two in one step, so `<dir>/<tag>` is never missing, then drop the old one.
    const int rc =
        ::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE);
    STEPWISE_CHECK(rc == 0, CheckpointError, "cannot replace checkpoint ", target.string(), ": ",
                   std::strerror(errno));
    remove_tree(partial);
  } else {
    std::error_code ec;
    fs::rename(partial, target, ec);
    STEPWISE_CHECK(!ec, CheckpointError, "cannot move ", partial, " to ", target.string(), ": ",
                   ec.message());
  }
  fsync_path(dir, true);
}

namespace {

void write_sum(const std::string& path, size_t size, uint64_t sum) {
  const std::string line = c10::str(kHashName, " ", size, " ", sum, "\n");
  write_bytes(path + ".sum", line.data(), line.size());
}

// Checks `path`'s size and hash against its sidecar, reading it in pieces.
void check_sum(const std::string& path) {
  std::ifstream sum_file(path + ".sum");
  std::string name;
  size_t size = 0;
  uint64_t sum = 0;
  STEPWISE_CHECK(fs::exists(path), CheckpointError, "checkpoint file ", path, " is missing");
  STEPWISE_CHECK(sum_file >> name, CheckpointError, "checkpoint file ", path,
                 ".sum is missing or unreadable: the checkpoint was not completely written");
  STEPWISE_CHECK(name == kHashName, CheckpointError, "checkpoint file ", path,
                 ".sum was written by an older stepwise (its checksum is not ", kHashName,
                 "): load the checkpoint with the stepwise that saved it and save it again");
  STEPWISE_CHECK(sum_file >> size >> sum, CheckpointError, "checkpoint file ", path,
                 ".sum is unreadable: the checkpoint was not completely written");
  // Hashed through one reused 1 MiB buffer (pread): read through a mapping, each page of
  // the file cost a fault (an 80 MB file: 6-40 ms on the CI machine; 7-10 ms this way).
  // The structure check reads the headers only, through a mapping.
  const int fd = ::open(path.c_str(), O_RDONLY);
  STEPWISE_CHECK(fd >= 0, CheckpointError, "cannot open checkpoint file ", path, ": ",
                 std::strerror(errno));
  std::error_code ec;
  const auto total = static_cast<size_t>(fs::file_size(path, ec));
  if (ec) {
    ::close(fd);
    throw CheckpointError(c10::str("cannot read checkpoint file ", path, ": ", ec.message()));
  }
  StreamingHash hash;
  std::vector<char> buffer(size_t{1} << 20);
  for (size_t done = 0; done < total;) {
    const ssize_t n =
        ::pread(fd, buffer.data(), std::min(buffer.size(), total - done), static_cast<off_t>(done));
    if (n <= 0) {
      const std::string why = n == 0 ? "it became shorter while it was read" : std::strerror(errno);
      ::close(fd);
      throw CheckpointError(c10::str("cannot read checkpoint file ", path, ": ", why));
    }
    hash.update(buffer.data(), static_cast<size_t>(n));
    done += static_cast<size_t>(n);
  }
  std::string structure = "it is empty";
  if (total > 0) {
    void* data = ::mmap(nullptr, total, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      ::close(fd);
      throw CheckpointError(
          c10::str("cannot map checkpoint file ", path, ": ", std::strerror(errno)));
    }
    structure = zip_structure_problem(static_cast<const unsigned char*>(data), total);
    ::munmap(data, total);
  }
  ::close(fd);
  STEPWISE_CHECK(size == total && sum == hash.finish(), CheckpointError, "checkpoint file ", path,
                 " (", total, " bytes) is truncated or corrupted: ",
                 size == total ? "its checksum differs from the one written with it"
                               : c10::str("it should have ", size, " bytes"));
  // see NOTE: [zip structure check]: damage that a rewritten sidecar hides.
  STEPWISE_CHECK(structure.empty(), CheckpointError, "checkpoint file ", path,
                 " is damaged: ", structure,
                 " (its checksum sidecar was written after the damage)");
}

}  // namespace

// NOTE: [checkpoint checksums] The zip that pickle_save writes is read back without
// checking its CRCs, so a flipped byte in tensor data would load silently. Each file
// has a sidecar `<file>.sum` ("xxh3 <size> <hash>": xxHash's XXH3-64 of the bytes), written
// after it and checked before it is unpickled. A sidecar without the hash's name comes from
// an older stepwise (another hash) and is refused by name.
// Streams what `produce` hands its writer into `path` (hashed on the way), flushes it to
// disk and writes its checksum sidecar.
using ByteWriter = std::function<size_t(const void*, size_t)>;
void write_streamed(const std::string& path,
                    const std::function<void(const ByteWriter&)>& produce) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  StreamingHash hash;
  size_t size = 0;
  produce([&](const void* data, size_t n) -> size_t {
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    hash.update(data, n);
    size += n;
    return n;
  });
  out.flush();
  STEPWISE_CHECK(out.good(), CheckpointError, "cannot write checkpoint file ", path, ": ",
                 std::strerror(errno));
  out.close();
  fsync_path(path, false);
  write_sum(path, size, hash.finish());
}

void write_pickle(const std::string& path, const c10::IValue& value) {
  // What torch::pickle_save does, streamed into the file instead of a vector: the pickle
  // itself is small (tensor data goes out of band), the tensors go straight to disk.
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); });
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  write_streamed(path, [&](const ByteWriter& write) {
    caffe2::serialize::PyTorchStreamWriter writer(write);
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                       writer);
    writer.writeEndOfFile();
  });
}

c10::IValue read_pickle(const std::string& path) {
  STEPWISE_CHECK(fs::exists(path), CheckpointError, "checkpoint file ", path, " is missing; ",
                 tags_present(fs::path(path).parent_path().parent_path().string()));
  check_sum(path);
  return read_foreign_pickle(path);
}

c10::IValue read_foreign_pickle(const std::string& path) {
  return reading(path, [&] {
    // What torch::pickle_load does, reading the file in place of a copy of it in memory.
    caffe2::serialize::PyTorchStreamReader reader(path);
    return torch::jit::readArchiveAndTensors("data", "", "", c10::nullopt, c10::nullopt,
                                             c10::nullopt, reader);
  });
}

void write_archive(const std::string& path, torch::serialize::OutputArchive& archive) {
  write_streamed(path, [&](const ByteWriter& write) { archive.save_to(write); });
}

void read_archive(const std::string& path, torch::serialize::InputArchive& archive) {
  check_sum(path);
  reading(path, [&] { archive.load_from(path); });
}

}  // namespace detail
}  // namespace stepwise
