// OFRecord part files: parsing, writing and the prefetching batch reader.
#include "runtime/ofrecord.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#ifdef FLOWJIT_HAVE_PNG
#include <png.h>
#endif
#ifdef FLOWJIT_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

#include "ir/error.h"

namespace flowjit::runtime::ofrecord {

namespace {

// ---------------------------------------------------------------- protobuf wire format

struct Cursor {
  const char* p;
  const char* end;
  bool done() const { return p >= end; }
};

[[noreturn]] void malformed(const char* what) {
  throw_user(ErrorKind::Value, "malformed OFRecord: ", what);
}

uint64_t varint(Cursor& c) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (c.done()) malformed("a varint runs past the end");
    auto b = static_cast<uint8_t>(*c.p++);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  malformed("a varint longer than 10 bytes");
}

std::string_view length_delimited(Cursor& c) {
  uint64_t n = varint(c);
  if (n > static_cast<uint64_t>(c.end - c.p)) malformed("a field runs past the end");
  std::string_view s(c.p, static_cast<size_t>(n));
  c.p += n;
  return s;
}

template <class T>
T fixed(Cursor& c) {
  if (c.end - c.p < static_cast<std::ptrdiff_t>(sizeof(T)))
    malformed("a fixed field runs past the end");
  T v;
  std::memcpy(&v, c.p, sizeof(T));
  c.p += sizeof(T);
  return v;
}

void skip(Cursor& c, int wire) {
  switch (wire) {
    case 0:
      varint(c);
      return;
    case 1:
      fixed<uint64_t>(c);
      return;
    case 2:
      length_delimited(c);
      return;
    case 5:
      fixed<uint32_t>(c);
      return;
    default:
      malformed("an unknown wire type");
  }
}

// One list message (BytesList, FloatList, ...) into f; packed or not.
void parse_list(std::string_view data, Feature& f) {
  Cursor c{data.data(), data.data() + data.size()};
  while (!c.done()) {
    uint64_t tag = varint(c);
    int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (field != 1) {
      skip(c, wire);
      continue;
    }
    using K = Feature::Kind;
    auto one = [&](Cursor& in) {
      switch (f.kind) {
        case K::Float:
          f.numbers.push_back(fixed<float>(in));
          break;
        case K::Double:
          f.numbers.push_back(fixed<double>(in));
          break;
        case K::Int32: {
          auto v = static_cast<int32_t>(static_cast<uint32_t>(varint(in)));
          f.ints.push_back(v);
          f.numbers.push_back(v);
          break;
        }
        case K::Int64: {
          auto v = static_cast<int64_t>(varint(in));
          f.ints.push_back(v);
          f.numbers.push_back(static_cast<double>(v));
          break;
        }
        default:
          malformed("a value in an unknown list");
      }
    };
    if (f.kind == K::Bytes) {
      if (wire != 2) malformed("a bytes value that is not length-delimited");
      f.bytes.push_back(length_delimited(c));
    } else if (wire == 2) {  // packed
      std::string_view packed = length_delimited(c);
      Cursor in{packed.data(), packed.data() + packed.size()};
      while (!in.done()) one(in);
    } else {
      one(c);
    }
  }
}

Feature parse_feature(std::string_view data) {
  Feature f;
  Cursor c{data.data(), data.data() + data.size()};
  while (!c.done()) {
    uint64_t tag = varint(c);
    int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (field < 1 || field > 5 || wire != 2) {
      skip(c, wire);
      continue;
    }
    f = Feature();
    f.kind = static_cast<Feature::Kind>(field);  // Bytes = 1 ... Int64 = 5
    parse_list(length_delimited(c), f);
  }
  return f;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_bytes(std::string& out, int field, std::string_view s) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, s.size());
  out.append(s);
}

// ---------------------------------------------------------------- decoding into a batch

template <class T>
void store_as(char* dst, int64_t i, T v) {
  std::memcpy(dst + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

void store(char* base, int64_t i, ir::DType t, double d, int64_t exact, bool use_exact) {
  using ir::DType;
  switch (t) {
    case DType::Bool:
      return store_as<uint8_t>(base, i, use_exact ? exact != 0 : d != 0);
    case DType::Int8:
      return store_as<int8_t>(base, i,
                              static_cast<int8_t>(use_exact ? exact : static_cast<int64_t>(d)));
    case DType::UInt8:
      return store_as<uint8_t>(base, i,
                               static_cast<uint8_t>(use_exact ? exact : static_cast<int64_t>(d)));
    case DType::Int32:
      return store_as<int32_t>(base, i,
                               static_cast<int32_t>(use_exact ? exact : static_cast<int64_t>(d)));
    case DType::Int64:
      return store_as<int64_t>(base, i, use_exact ? exact : static_cast<int64_t>(d));
    case DType::Float32:
      return store_as<float>(base, i,
                             static_cast<float>(use_exact ? static_cast<double>(exact) : d));
    case DType::Float64:
      return store_as<double>(base, i, use_exact ? static_cast<double>(exact) : d);
    case DType::Float16:
    case DType::BFloat16:
      return store_as<uint16_t>(
          base, i,
          ir::float_to_half(static_cast<float>(use_exact ? static_cast<double>(exact) : d), t));
  }
}

}  // namespace

std::vector<std::pair<std::string, Feature>> parse(std::string_view data) {
  std::vector<std::pair<std::string, Feature>> out;
  Cursor c{data.data(), data.data() + data.size()};
  while (!c.done()) {
    uint64_t tag = varint(c);
    int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (field != 1 || wire != 2) {
      skip(c, wire);
      continue;
    }
    std::string_view entry = length_delimited(c);
    Cursor e{entry.data(), entry.data() + entry.size()};
    std::string key;
    Feature value;
    while (!e.done()) {
      uint64_t t = varint(e);
      int f = static_cast<int>(t >> 3), w = static_cast<int>(t & 7);
      if (f == 1 && w == 2) {
        key = std::string(length_delimited(e));
      } else if (f == 2 && w == 2) {
        value = parse_feature(length_delimited(e));
      } else {
        skip(e, w);
      }
    }
    out.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

void append_record(std::string& out,
                   const std::vector<std::pair<std::string, OwnedFeature>>& features) {
  std::string rec;
  for (const auto& [key, f] : features) {
    std::string list;
    using K = Feature::Kind;
    switch (f.kind) {
      case K::Bytes:
        for (const std::string& b : f.bytes) put_bytes(list, 1, b);
        break;
      case K::Float: {
        std::string packed;
        for (double v : f.numbers) {
          auto x = static_cast<float>(v);
          packed.append(reinterpret_cast<const char*>(&x), 4);
        }
        put_bytes(list, 1, packed);
        break;
      }
      case K::Double: {
        std::string packed;
        for (double v : f.numbers) packed.append(reinterpret_cast<const char*>(&v), 8);
        put_bytes(list, 1, packed);
        break;
      }
      case K::Int32:
      case K::Int64: {
        std::string packed;
        for (int64_t v : f.ints)
          put_varint(packed,
                     static_cast<uint64_t>(
                         f.kind == K::Int32 ? static_cast<int64_t>(static_cast<int32_t>(v)) : v));
        put_bytes(list, 1, packed);
        break;
      }
      case K::None:
        break;
    }
    std::string feature;
    if (f.kind != K::None) put_bytes(feature, static_cast<int>(f.kind), list);
    std::string entry;
    put_bytes(entry, 1, key);
    put_bytes(entry, 2, feature);
    put_bytes(rec, 1, entry);
  }
  auto n = static_cast<int64_t>(rec.size());
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(rec);
}

// ---------------------------------------------------------------- the reader

Reader::Reader(ReaderOptions options) : opt_(std::move(options)) {
  FJ_USER_CHECK(opt_.batch_size >= 1, ErrorKind::Value,
                "ofrecord_reader: batch_size must be >= 1, got ", opt_.batch_size);
  FJ_USER_CHECK(!opt_.files.empty(), ErrorKind::Value, "ofrecord_reader: no part files");
  for (const std::string& f : opt_.files) {
    std::ifstream in(f, std::ios::binary);
    FJ_USER_CHECK(in.good(), ErrorKind::Value, "ofrecord_reader: cannot open the part file '", f,
                  "': ", std::strerror(errno));
  }
  const int64_t end = opt_.rows_end < 0 ? opt_.batch_size : opt_.rows_end;
  FJ_USER_CHECK(opt_.rows_begin >= 0 && opt_.rows_begin < end && end <= opt_.batch_size,
                ErrorKind::Value,
                "ofrecord_reader: the rows to decode must be a non-empty range "
                "within the batch of ",
                opt_.batch_size, ", got [", opt_.rows_begin, ", ", end, ")");
  opt_.rows_end = end;
  opt_.prefetch = std::max(opt_.prefetch, 1);
  opt_.shuffle_buffer = std::max<int64_t>(opt_.shuffle_buffer, 1);
}

Reader::~Reader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t Reader::records_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

std::vector<std::vector<char>> Reader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { run(); });
  }
  cv_.wait(lock, [&] { return !ready_.empty() || error_ != nullptr; });
  if (ready_.empty()) std::rethrow_exception(error_);
  std::vector<std::vector<char>> batch = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
  return batch;
}

namespace {

// Bilinear resize of an interleaved uint8 image with half-pixel centers
// (OpenCV's INTER_LINEAR, which OneFlow's image ops use), rounding to nearest.
std::vector<uint8_t> resize_bilinear(const std::vector<uint8_t>& src, int64_t h, int64_t w,
                                     int64_t c, int64_t oh, int64_t ow) {
  std::vector<uint8_t> out(static_cast<size_t>(oh * ow * c));
  double sy = static_cast<double>(h) / oh, sx = static_cast<double>(w) / ow;
  for (int64_t y = 0; y < oh; ++y) {
    double fy = std::max(0.0, (y + 0.5) * sy - 0.5);
    auto y0 = std::min(static_cast<int64_t>(fy), h - 1);
    int64_t y1 = std::min(y0 + 1, h - 1);
    double ay = fy - y0;
    for (int64_t x = 0; x < ow; ++x) {
      double fx = std::max(0.0, (x + 0.5) * sx - 0.5);
      auto x0 = std::min(static_cast<int64_t>(fx), w - 1);
      int64_t x1 = std::min(x0 + 1, w - 1);
      double ax = fx - x0;
      for (int64_t k = 0; k < c; ++k) {
        auto at = [&](int64_t yy, int64_t xx) {
          return static_cast<double>(src[(yy * w + xx) * c + k]);
        };
        double v = (1 - ay) * ((1 - ax) * at(y0, x0) + ax * at(y0, x1)) +
                   ay * ((1 - ax) * at(y1, x0) + ax * at(y1, x1));
        out[(y * ow + x) * c + k] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  }
  return out;
}

std::vector<uint8_t> crop(const std::vector<uint8_t>& src, int64_t w, int64_t c, int64_t y0,
                          int64_t x0, int64_t ch, int64_t cw) {
  std::vector<uint8_t> out(static_cast<size_t>(ch * cw * c));
  for (int64_t y = 0; y < ch; ++y)
    std::memcpy(out.data() + y * cw * c, src.data() + ((y0 + y) * w + x0) * c,
                static_cast<size_t>(cw * c));
  return out;
}

}  // namespace

bool jpeg_support() {
#ifdef FLOWJIT_HAVE_TURBOJPEG
  return true;
#else
  return false;
#endif
}

bool png_support() {
#ifdef FLOWJIT_HAVE_PNG
  return true;
#else
  return false;
#endif
}

namespace {

#ifdef FLOWJIT_HAVE_PNG
// libpng reports errors with longjmp: this function keeps only plain C
// values between its setjmp and libpng's calls, so nothing needs unwinding.
// 8 bits per channel, 3 channels (RGB, or BGR): gray is repeated, a palette
// expanded, alpha dropped (not composited) and 16-bit samples cut to their
// high byte, as OpenCV's imdecode(IMREAD_COLOR) reads them (OneFlow's
// decoder). Returns 0, or 1 with `err` set; *out is malloc'ed.
struct PngSource {
  const unsigned char* data;
  size_t size, at;
};

void png_read_memory(png_structp png, png_bytep dst, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->size - src->at < n) png_error(png, "the image data ends early");
  std::memcpy(dst, src->data + src->at, n);
  src->at += n;
}

void png_on_error(png_structp png, png_const_charp msg) {
  auto* err = static_cast<char*>(png_get_error_ptr(png));
  std::snprintf(err, 256, "%s", msg);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

int png_decode(const unsigned char* data, size_t size, int bgr, unsigned char** out, int* w, int* h,
               char* err) {
  *out = nullptr;
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, err, png_on_error, png_on_warning);
  if (png == nullptr) {
    std::snprintf(err, 256, "cannot create a PNG reader");
    return 1;
  }
  png_infop info = png_create_info_struct(png);
  png_bytepp rows = nullptr;
  PngSource src{data, size, 0};
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    std::free(rows);
    std::free(*out);
    *out = nullptr;
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    if (info == nullptr) std::snprintf(err, 256, "cannot create a PNG reader");
    return 1;
  }
  png_set_read_fn(png, &src, png_read_memory);
  // Images are limited to 2^14 pixels a side (a decoded row fits in memory).
  png_set_user_limits(png, 1 << 14, 1 << 14);
  png_read_info(png, info);
  png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  int type = png_get_color_type(png, info);
  if (png_get_bit_depth(png, info) == 16) png_set_strip_16(png);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8)
    png_set_expand_gray_1_2_4_to_8(png);
  if (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  if (type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png), png_set_strip_alpha(png);
  if (bgr) png_set_bgr(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<png_size_t>(width) * 3) {
    std::snprintf(err, 256, "an unexpected PNG layout (%u bytes per row)",
                  static_cast<unsigned>(png_get_rowbytes(png, info)));
    png_destroy_read_struct(&png, &info, nullptr);
    return 1;
  }
  *out = static_cast<unsigned char*>(std::malloc(static_cast<size_t>(width) * height * 3));
  rows = static_cast<png_bytepp>(std::malloc(sizeof(png_bytep) * height));
  if (*out == nullptr || rows == nullptr) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = *out + static_cast<size_t>(y) * width * 3;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  std::free(rows);
  png_destroy_read_struct(&png, &info, nullptr);
  *w = static_cast<int>(width);
  *h = static_cast<int>(height);
  return 0;
}
#endif

bool is_png(std::string_view b) { return b.size() >= 8 && b.substr(0, 8) == "\x89PNG\r\n\x1a\n"; }

}  // namespace

// The pixels of an encoded JPEG or PNG image: h x w x 3 bytes, RGB or BGR.
std::vector<uint8_t> Reader::decode_pixels(const Field& field, std::string_view bytes, int* w,
                                           int* h, const std::string& where) {
  const bool bgr = field.image.bgr;
  if (is_png(bytes)) {
#ifndef FLOWJIT_HAVE_PNG
    throw_user(ErrorKind::NotImplemented, "ofrecord image decoder: feature '", field.name, "' of ",
               where,
               " is a PNG image, and this flowjit was built without libpng (install "
               "libpng-dev and rebuild)");
#else
    unsigned char* px = nullptr;
    char err[256] = {0};
    FJ_USER_CHECK(png_decode(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                             bgr ? 1 : 0, &px, w, h, err) == 0,
                  ErrorKind::Value, "ofrecord image decoder: feature '", field.name, "' of ", where,
                  " is not a PNG image flowjit can decode (", err, ")");
    std::vector<uint8_t> img(px, px + static_cast<size_t>(*w) * *h * 3);
    std::free(px);
    return img;
#endif
  }
#ifndef FLOWJIT_HAVE_TURBOJPEG
  throw_user(
      ErrorKind::NotImplemented, "ofrecord image decoder: feature '", field.name, "' of ", where,
      ": this flowjit was built without libjpeg-turbo (install libturbojpeg0-dev and rebuild)");
#else
  tjhandle tj = tjInitDecompress();
  FJ_CHECK(tj != nullptr, "libjpeg-turbo: cannot create a decompressor");
  struct Free {
    tjhandle h;
    ~Free() { tjDestroy(h); }
  } free_tj{tj};
  int sub = 0, space = 0;
  auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  FJ_USER_CHECK(tjDecompressHeader3(tj, data, static_cast<unsigned long>(bytes.size()), w, h, &sub,
                                    &space) == 0,
                ErrorKind::Value, "ofrecord image decoder: feature '", field.name, "' of ", where,
                " is not a JPEG or PNG image flowjit can decode (", tjGetErrorStr2(tj), ")");
  std::vector<uint8_t> img(static_cast<size_t>(int64_t{*w} * *h * 3));
  FJ_USER_CHECK(tjDecompress2(tj, data, static_cast<unsigned long>(bytes.size()), img.data(), *w, 0,
                              *h, bgr ? TJPF_BGR : TJPF_RGB, TJFLAG_ACCURATEDCT) == 0,
                ErrorKind::Value, "ofrecord image decoder: feature '", field.name, "' of ", where,
                ": ", tjGetErrorStr2(tj));
  return img;
#endif
}

void Reader::decode_image(const Field& field, std::string_view encoded, char* out,
                          const std::string& where) {
  const Field::Image& im = field.image;
  int w = 0, h = 0;
  std::vector<uint8_t> img = decode_pixels(field, encoded, &w, &h, where);
  const int64_t c = 3;
  int64_t ih = h, iw = w;
  if (im.random_crop) {
    std::uniform_real_distribution<double> area(im.area_min, im.area_max);
    std::uniform_real_distribution<double> log_ratio(std::log(im.ratio_min),
                                                     std::log(im.ratio_max));
    for (int a = 0; a < im.attempts; ++a) {
      double target = area(image_rng_) * static_cast<double>(ih * iw);
      double ratio = std::exp(log_ratio(image_rng_));
      auto cw = static_cast<int64_t>(std::lround(std::sqrt(target * ratio)));
      auto ch = static_cast<int64_t>(std::lround(std::sqrt(target / ratio)));
      if (cw < 1 || ch < 1 || cw > iw || ch > ih) continue;
      std::uniform_int_distribution<int64_t> py(0, ih - ch), px(0, iw - cw);
      int64_t y0 = py(image_rng_), x0 = px(image_rng_);
      img = crop(img, iw, c, y0, x0, ch, cw);
      ih = ch, iw = cw;
      break;
    }
  }
  if (im.resize_h > 0) {
    img = resize_bilinear(img, ih, iw, c, im.resize_h, im.resize_w);
    ih = im.resize_h, iw = im.resize_w;
  } else if (im.shorter > 0) {
    double s = static_cast<double>(im.shorter) / static_cast<double>(std::min(ih, iw));
    int64_t oh = std::max<int64_t>(1, std::lround(ih * s)),
            ow = std::max<int64_t>(1, std::lround(iw * s));
    img = resize_bilinear(img, ih, iw, c, oh, ow);
    ih = oh, iw = ow;
  }
  if (im.crop_h > 0) {
    FJ_USER_CHECK(im.crop_h <= ih && im.crop_w <= iw, ErrorKind::Value,
                  "ofrecord image decoder: ", where, ": a ", im.crop_h, "x", im.crop_w,
                  " crop of a ", ih, "x", iw, " image");
    // OneFlow's offset: the room left times the position, truncated.
    auto y0 = static_cast<int64_t>(static_cast<double>(ih - im.crop_h) * im.pos_y);
    auto x0 = static_cast<int64_t>(static_cast<double>(iw - im.crop_w) * im.pos_x);
    img = crop(img, iw, c, y0, x0, im.crop_h, im.crop_w);
    ih = im.crop_h, iw = im.crop_w;
  }
  FJ_USER_CHECK(field.shape == ir::Shape({ih, iw, c}), ErrorKind::Value,
                "ofrecord image decoder: ", where, " gives a ", ih, "x", iw,
                " image, but the blob's shape is ", ir::shape_str(field.shape),
                "; resize it to a fixed size or crop it");
  std::memcpy(out, img.data(), img.size());
}

void Reader::decode_into(const std::vector<std::pair<std::string, Feature>>& rec, int64_t row,
                         std::vector<std::vector<char>>& batch, const std::string& where) {
  for (size_t fi = 0; fi < opt_.fields.size(); ++fi) {
    const Field& field = opt_.fields[fi];
    const Feature* f = nullptr;
    for (const auto& [k, v] : rec)
      if (k == field.name) f = &v;
    FJ_USER_CHECK(f != nullptr, ErrorKind::Value, "ofrecord_raw_decoder: ", where,
                  " has no feature '", field.name, "'");
    int64_t n = ir::num_elements(field.shape);
    char* base = batch[fi].data() + row * n * ir::dtype_bytes(field.dtype);
    std::memset(base, 0, static_cast<size_t>(n * ir::dtype_bytes(field.dtype)));
    using K = Feature::Kind;
    if (field.is_image) {
      FJ_USER_CHECK(f->kind == K::Bytes && f->bytes.size() == 1, ErrorKind::Value,
                    "ofrecord image decoder: feature '", field.name, "' of ", where,
                    " must hold one bytes value (an encoded image)");
      decode_image(field, f->bytes[0], base, where);
      continue;
    }
    if (f->kind == K::Bytes) {
      // OneFlow's raw decoder reads the first bytes value as int8 elements.
      FJ_USER_CHECK(f->bytes.size() == 1, ErrorKind::Value, "ofrecord_raw_decoder: feature '",
                    field.name, "' of ", where, " holds ", f->bytes.size(),
                    " bytes values; the raw decoder reads one");
      std::string_view b = f->bytes[0];
      int64_t m = std::min<int64_t>(n, static_cast<int64_t>(b.size()));
      for (int64_t i = 0; i < m; ++i)
        store(base, i, field.dtype, static_cast<int8_t>(b[i]), static_cast<int8_t>(b[i]), true);
      continue;
    }
    FJ_USER_CHECK(f->kind != K::None, ErrorKind::Value, "ofrecord_raw_decoder: feature '",
                  field.name, "' of ", where, " holds no list");
    auto have = static_cast<int64_t>(f->numbers.size());
    FJ_USER_CHECK(field.truncate || have == n, ErrorKind::Value, "ofrecord_raw_decoder: feature '",
                  field.name, "' of ", where, " holds ", have, " values, but the decoder's shape ",
                  ir::shape_str(field.shape), " takes ", n,
                  " (truncate=True cuts or zero-pads it)");
    int64_t m = std::min(n, have);
    bool exact = !f->ints.empty();
    for (int64_t i = 0; i < m; ++i)
      store(base, i, field.dtype, f->numbers[i], exact ? f->ints[i] : 0, exact);
  }
}

void Reader::run() {
  try {
    std::mt19937_64 rng(opt_.seed);
    std::vector<size_t> order(opt_.files.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto new_batch = [&] {
      std::vector<std::vector<char>> b;
      for (const Field& f : opt_.fields)
        b.emplace_back(static_cast<size_t>(opt_.rows() * ir::num_elements(f.shape) *
                                           ir::dtype_bytes(f.dtype)));
      return b;
    };
    auto batch = new_batch();
    int64_t row = 0;
    struct Held {
      std::string bytes;
      std::string where;
    };
    std::vector<Held> buffer;
    bool images = false;
    for (const Field& f : opt_.fields) images |= f.is_image;
    uint64_t sequence = 0;  // records emitted before this one, over all batches
    auto emit = [&](Held& h) {
      if (row >= opt_.rows_begin && row < opt_.rows_end) {
        if (images) {  // the record's own crop numbers (ReaderOptions::rows_begin)
          std::seed_seq seq{static_cast<uint32_t>(opt_.seed),
                            static_cast<uint32_t>(opt_.seed >> 32), static_cast<uint32_t>(sequence),
                            static_cast<uint32_t>(sequence >> 32), 0x9E3779B9u};
          image_rng_.seed(seq);
        }
        decode_into(parse(h.bytes), row - opt_.rows_begin, batch, h.where);
      }
      ++sequence;
      if (++row < opt_.batch_size) return true;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(ready_.size()) < opt_.prefetch; });
      if (stop_) return false;
      ready_.push_back(std::move(batch));
      cv_.notify_all();
      lock.unlock();
      batch = new_batch();
      row = 0;
      return true;
    };
    for (int64_t epoch = 0;; ++epoch) {
      if (opt_.shuffle_after_epoch) std::shuffle(order.begin(), order.end(), rng);
      int64_t in_epoch = 0;
      for (size_t fi : order) {
        const std::string& path = opt_.files[fi];
        std::ifstream in(path, std::ios::binary);
        FJ_USER_CHECK(in.good(), ErrorKind::Runtime, "ofrecord_reader: cannot open '", path, "'");
        for (int64_t index = 0;; ++index) {
          int64_t n = 0;
          in.read(reinterpret_cast<char*>(&n), 8);
          if (in.gcount() == 0 && in.eof()) break;
          FJ_USER_CHECK(in.gcount() == 8 && n >= 0 && n < (int64_t{1} << 40), ErrorKind::Value,
                        "ofrecord_reader: '", path, "' record ", index,
                        ": a truncated or corrupt length (an OFRecord file is int64 length + bytes "
                        "per record)");
          Held h{std::string(static_cast<size_t>(n), '\0'),
                 "'" + path + "' record " + std::to_string(index)};
          in.read(h.bytes.data(), n);
          FJ_USER_CHECK(in.gcount() == n, ErrorKind::Value, "ofrecord_reader: ", h.where,
                        " is cut short: ", in.gcount(), " of its ", n, " bytes");
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (stop_) return;
            ++records_;
          }
          ++in_epoch;
          if (!opt_.shuffle) {
            if (!emit(h)) return;
            continue;
          }
          buffer.push_back(std::move(h));
          if (static_cast<int64_t>(buffer.size()) >= opt_.shuffle_buffer) {
            std::uniform_int_distribution<size_t> pick(0, buffer.size() - 1);
            std::swap(buffer[pick(rng)], buffer.back());
            Held out = std::move(buffer.back());
            buffer.pop_back();
            if (!emit(out)) return;
          }
        }
      }
      FJ_USER_CHECK(in_epoch > 0, ErrorKind::Value,
                    "ofrecord_reader: the part files hold no records");
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

}  // namespace flowjit::runtime::ofrecord
