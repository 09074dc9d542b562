// OneFlow's OFRecord data sets, read by native code for the data ops inside
// jobs (flow.data.ofrecord_reader and its decoders).
//
// A data set is a folder of part files (part-0, part-1, ... or zero-padded
// names); each file is a sequence of records, every record an int64 byte
// count (little-endian) followed by a serialized OFRecord protobuf:
//
//   message OFRecord { map<string, Feature> feature = 1; }
//   message Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                      DoubleList double_list = 3; Int32List int32_list = 4;
//                      Int64List int64_list = 5; } }
//
// with each list a `repeated ... value = 1` (packed for the numbers). The
// reader decodes the fields a job asked for into dense batches on a thread
// of its own, a few batches ahead of the job, looping over the epochs; with
// shuffling it draws records at random from a buffer of them and reorders
// the part files every epoch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ir/types.h"

namespace flowjit::runtime::ofrecord {

// One feature of a record as the protobuf holds it.
struct Feature {
  enum class Kind { None, Bytes, Float, Double, Int32, Int64 };
  Kind kind = Kind::None;
  std::vector<std::string_view> bytes;  // Bytes: views into the record
  std::vector<double> numbers;          // the numeric kinds, widened (int64 exactly below 2^53)
  std::vector<int64_t> ints;            // Int32 and Int64 exactly
};

// Parses one serialized OFRecord; throws a UserError (ErrorKind::Value)
// naming what is malformed. The returned views point into `data`.
std::vector<std::pair<std::string, Feature>> parse(std::string_view data);

// Writes `features` as one framed record (the byte count, then the protobuf)
// onto `out`: what the writer tools and the tests use.
struct OwnedFeature {
  Feature::Kind kind = Feature::Kind::Int64;
  std::vector<std::string> bytes;
  std::vector<double> numbers;  // Float, Double
  std::vector<int64_t> ints;    // Int32, Int64
};
void append_record(std::string& out,
                   const std::vector<std::pair<std::string, OwnedFeature>>& features);

// A field decoded as OneFlow's ofrecord_raw_decoder does: the named feature
// of each record, `shape` elements (a bytes feature: its bytes, as int8),
// converted to `dtype`; with `truncate`, longer lists are cut and shorter
// ones padded with zeros, else the count must match.
struct Field {
  std::string name;
  ir::Shape shape;
  ir::DType dtype = ir::DType::Float32;
  bool truncate = false;
  // An image field: the feature's one bytes value is a JPEG file, decoded
  // (OneFlow's OFRecordImageDecoder[RandomCrop]), resized and cropped into a
  // uint8 (height, width, channels) element; `shape` is that size.
  struct Image {
    bool bgr = false;  // channel order of the result (OneFlow's color_space)
    // A random crop of the decoded image first (OneFlow's RandomCropGenerator):
    // an area in [area_min, area_max] of the image and an aspect ratio
    // log-uniform in [ratio_min, ratio_max], `attempts` tries, else the whole image.
    bool random_crop = false;
    double area_min = 0.08, area_max = 1.0, ratio_min = 0.75, ratio_max = 4.0 / 3.0;
    int attempts = 10;
    // Then a bilinear resize (half-pixel centers): to resize_h x resize_w, or
    // its shorter side to `shorter` keeping the aspect ratio (0: none).
    int64_t resize_h = 0, resize_w = 0, shorter = 0;
    // Then a crop of crop_h x crop_w at (pos_y, pos_x) in [0, 1] of the room left.
    int64_t crop_h = 0, crop_w = 0;
    double pos_y = 0.5, pos_x = 0.5;
  };
  bool is_image = false;
  Image image;
};

// Whether this build decodes JPEG images (it links libjpeg-turbo).
bool jpeg_support();
// Whether this build decodes PNG images (it links libpng).
bool png_support();

struct ReaderOptions {
  std::vector<std::string> files;  // the part files, in order
  int64_t batch_size = 1;
  bool shuffle = false;              // draw records at random from a buffer
  int64_t shuffle_buffer = 1024;     // records held for shuffling
  bool shuffle_after_epoch = false;  // reorder the part files every epoch
  uint64_t seed = 0;
  int prefetch = 2;  // batches decoded ahead
  std::vector<Field> fields;
  // The rows of each batch this reader decodes and returns: [rows_begin,
  // rows_end) of batch_size (rows_end -1: to the end). A process of a job in
  // the mirrored view decodes only its devices' rows. Every record is still
  // read (the order, the shuffle and the epochs are the whole batch's), and
  // an image's random crop draws from its record's own position in the
  // stream, so a row holds the same data whichever rows a reader keeps.
  int64_t rows_begin = 0;
  int64_t rows_end = -1;
  int64_t rows() const { return (rows_end < 0 ? batch_size : rows_end) - rows_begin; }
};

class Reader {
 public:
  // Checks that every file exists and can be opened (a UserError naming the
  // first that cannot); the thread starts with the first next().
  explicit Reader(ReaderOptions options);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // The next batch: one buffer per field, rows() x numel(shape) elements of
  // the field's dtype. Blocks until the thread has it; rethrows what
  // stopped the thread (a malformed record, a vanished file), naming the
  // file and the record.
  std::vector<std::vector<char>> next();
  const ReaderOptions& options() const { return opt_; }
  int64_t records_read() const;

 private:
  void run();
  void decode_into(const std::vector<std::pair<std::string, Feature>>& rec, int64_t row,
                   std::vector<std::vector<char>>& batch, const std::string& where);
  void decode_image(const Field& field, std::string_view encoded, char* out,
                    const std::string& where);
  std::vector<uint8_t> decode_pixels(const Field& field, std::string_view encoded, int* w, int* h,
                                     const std::string& where);
  std::mt19937_64 image_rng_;  // the image crops' random numbers (the reader's thread only)

  ReaderOptions opt_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<std::vector<char>>> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  bool started_ = false;
  int64_t records_ = 0;
};

}  // namespace flowjit::runtime::ofrecord
