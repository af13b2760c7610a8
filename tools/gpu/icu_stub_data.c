/* An empty ICU data package, in place of Debian 12's 31 MB libicudata.so.72
 * in what tools/gpu/prepare.sh packs for a GPU machine (ICU's own
 * "stubdata" library, written out). dray asks ICU only for UTF-8
 * conversion, the NFC normaliser and regular expressions over Unicode
 * properties and case folding, whose data libicuuc carries compiled in;
 * the data package holds locales, collation and converters, none used.
 * The tokenizer tests pass with this library in LD_LIBRARY_PATH. */
#include <stdint.h>

typedef struct {
  uint16_t header_size;
  uint8_t magic1, magic2;
  struct {
    uint16_t size, reserved_word;
    uint8_t is_big_endian, charset_family, sizeof_uchar, reserved_byte;
    uint8_t data_format[4], format_version[4], data_version[4];
  } info;
  char padding[8];
  uint32_t count, reserved;
  int fake_name_and_data[4];
} IcuDataHeader;

__attribute__((visibility("default"))) const IcuDataHeader icudt72_dat = {
    32, 0xda, 0x27, {20, 0, 0, 0, 2, 0, {'T', 'o', 'C', 'P'}, {1, 0, 0, 0}, {0, 0, 0, 0}},
    {0}, 0, 0, {0}};
