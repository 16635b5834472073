package org.yuanrong.fnstream;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;

import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

/**
 * The frontend's framing (runtime/process/protocol.py): a 4-byte big-endian length, then one
 * msgpack map. Only what the protocol carries is supported; frames decode to gson trees so the
 * event reaches the handler without a second parse.
 */
public final class Wire {
    static final int MAX_FRAME = 64 * 1024 * 1024;

    private Wire() {
    }

    /** Reads one frame; EOFException when the frontend closed the socket. */
    static JsonObject read(DataInputStream in) throws IOException {
        int size = in.readInt();
        if (size < 0 || size > MAX_FRAME) {
            throw new IOException("frame of " + size + " bytes exceeds " + MAX_FRAME);
        }
        byte[] data = new byte[size];
        in.readFully(data);
        Decoder d = new Decoder(data);
        JsonElement msg = d.value();
        if (!msg.isJsonObject()) {
            throw new IOException("a frame must be a msgpack map");
        }
        return msg.getAsJsonObject();
    }

    /** A frame under construction: a map of `n` entries. */
    static final class Frame {
        final ByteArrayOutputStream buf = new ByteArrayOutputStream(64);

        Frame(int entries) {
            mapHeader(entries);
        }

        Frame key(String k) {
            return str(k);
        }

        Frame str(String s) {
            if (s == null) {
                return nil();
            }
            byte[] b = s.getBytes(StandardCharsets.UTF_8);
            int n = b.length;
            if (n < 32) {
                buf.write(0xa0 | n);
            } else if (n < 256) {
                buf.write(0xd9);
                buf.write(n);
            } else if (n < 65536) {
                buf.write(0xda);
                be(n, 2);
            } else {
                buf.write(0xdb);
                be(n, 4);
            }
            buf.write(b, 0, n);
            return this;
        }

        Frame num(long v) {
            if (v >= 0 && v < 128) {
                buf.write((int) v);
            } else if (v >= -32 && v < 0) {
                buf.write((int) (v & 0xff));
            } else {
                buf.write(0xd3);
                be(v, 8);
            }
            return this;
        }

        Frame bool(boolean v) {
            buf.write(v ? 0xc3 : 0xc2);
            return this;
        }

        Frame nil() {
            buf.write(0xc0);
            return this;
        }

        Frame arrayHeader(int n) {
            if (n < 16) {
                buf.write(0x90 | n);
            } else if (n < 65536) {
                buf.write(0xdc);
                be(n, 2);
            } else {
                buf.write(0xdd);
                be(n, 4);
            }
            return this;
        }

        private void mapHeader(int n) {
            if (n < 16) {
                buf.write(0x80 | n);
            } else {
                buf.write(0xde);
                be(n, 2);
            }
        }

        private void be(long v, int bytes) {
            for (int i = bytes - 1; i >= 0; i--) {
                buf.write((int) (v >>> (8 * i)) & 0xff);
            }
        }

        /** Writes the frame, length first (the caller holds the stream's lock and flushes). */
        void writeTo(OutputStream out) throws IOException {
            int n = buf.size();
            out.write(new byte[] {(byte) (n >>> 24), (byte) (n >>> 16), (byte) (n >>> 8), (byte) n});
            buf.writeTo(out);
        }
    }

    private static final class Decoder {
        private final byte[] b;
        private int pos;

        Decoder(byte[] b) {
            this.b = b;
        }

        private int u8() throws IOException {
            if (pos >= b.length) {
                throw new EOFException("truncated msgpack");
            }
            return b[pos++] & 0xff;
        }

        private long be(int n) throws IOException {
            long v = 0;
            for (int i = 0; i < n; i++) {
                v = (v << 8) | u8();
            }
            return v;
        }

        private String str(int n) throws IOException {
            if (pos + n > b.length) {
                throw new EOFException("truncated msgpack");
            }
            String s = new String(b, pos, n, StandardCharsets.UTF_8);
            pos += n;
            return s;
        }

        private JsonArray array(int n) throws IOException {
            JsonArray a = new JsonArray(n);
            for (int i = 0; i < n; i++) {
                a.add(value());
            }
            return a;
        }

        private JsonObject map(int n) throws IOException {
            JsonObject o = new JsonObject();
            for (int i = 0; i < n; i++) {
                JsonElement k = value();
                String key = k.isJsonPrimitive() ? k.getAsString() : k.toString();
                o.add(key, value());
            }
            return o;
        }

        JsonElement value() throws IOException {
            int t = u8();
            if (t < 0x80) {
                return new JsonPrimitive(t);
            }
            if (t >= 0xe0) {
                return new JsonPrimitive((byte) t);
            }
            if ((t & 0xf0) == 0x80) {
                return map(t & 0x0f);
            }
            if ((t & 0xf0) == 0x90) {
                return array(t & 0x0f);
            }
            if ((t & 0xe0) == 0xa0) {
                return new JsonPrimitive(str(t & 0x1f));
            }
            switch (t) {
                case 0xc0: return JsonNull.INSTANCE;
                case 0xc2: return new JsonPrimitive(false);
                case 0xc3: return new JsonPrimitive(true);
                case 0xc4: return bin((int) be(1));
                case 0xc5: return bin((int) be(2));
                case 0xc6: return bin((int) be(4));
                case 0xca: return new JsonPrimitive(Float.intBitsToFloat((int) be(4)));
                case 0xcb: return new JsonPrimitive(Double.longBitsToDouble(be(8)));
                case 0xcc: return new JsonPrimitive(be(1));
                case 0xcd: return new JsonPrimitive(be(2));
                case 0xce: return new JsonPrimitive(be(4));
                case 0xcf: return new JsonPrimitive(new java.math.BigInteger(Long.toUnsignedString(be(8))));
                case 0xd0: return new JsonPrimitive((byte) be(1));
                case 0xd1: return new JsonPrimitive((short) be(2));
                case 0xd2: return new JsonPrimitive((int) be(4));
                case 0xd3: return new JsonPrimitive(be(8));
                case 0xd9: return new JsonPrimitive(str((int) be(1)));
                case 0xda: return new JsonPrimitive(str((int) be(2)));
                case 0xdb: return new JsonPrimitive(str((int) be(4)));
                case 0xdc: return array((int) be(2));
                case 0xdd: return array((int) be(4));
                case 0xde: return map((int) be(2));
                case 0xdf: return map((int) be(4));
                default: throw new IOException("unsupported msgpack type 0x" + Integer.toHexString(t));
            }
        }

        private JsonElement bin(int n) throws IOException {
            if (pos + n > b.length) {
                throw new EOFException("truncated msgpack");
            }
            byte[] out = java.util.Arrays.copyOfRange(b, pos, pos + n);
            pos += n;
            return new JsonPrimitive(Base64.getEncoder().encodeToString(out));
        }
    }

    /** An optional string field (null when absent or nil). */
    static String optString(JsonObject o, String key) {
        JsonElement e = o.get(key);
        return e == null || e.isJsonNull() ? null : e.getAsString();
    }
}
