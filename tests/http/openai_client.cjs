// OpenAI's official Node.js client against dray serve's HTTP port:
//   node openai_client.cjs BASE_URL TOKEN IMAGE
// edits IMAGE twice in one call with dray's extra fields, streams one edit,
// and checks that a refusal and a wrong token reach the client as OpenAI's
// errors. Prints one line per check; exits 1 on the first that fails.
const fs = require("fs");
const OpenAI = require("openai");

const [baseURL, token, imagePath] = process.argv.slice(2);

function check(ok, what) {
  if (!ok) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

// pngSize reads a PNG's width and height from its header.
function pngSize(base64) {
  const png = Buffer.from(base64, "base64");
  check(png.subarray(1, 4).toString() === "PNG", "the image is a PNG");
  return [png.readUInt32BE(16), png.readUInt32BE(20)];
}

async function main() {
  const client = new OpenAI({ apiKey: token, baseURL });
  const picture = () => OpenAI.toFile(fs.createReadStream(imagePath), "scene.png", { type: "image/png" });

  const edited = await client.images.edit({
    image: await picture(),
    prompt: "make it purple",
    n: 2,
    size: "64x64",
    response_format: "b64_json",
    steps: 2, // dray's own fields travel as extra form fields
    seed: 3,
  });
  check(edited.data.length === 2, "n = 2 gives two images");
  check(JSON.stringify(pngSize(edited.data[0].b64_json)) === "[64,64]", "at the size asked");
  check(edited.data[1].seed === 4, "seeds seed, seed + 1");

  const stream = await client.images.edit({
    image: await picture(),
    prompt: "make it purple",
    stream: true,
    steps: 2,
  });
  const types = [];
  for await (const event of stream) types.push(event.type);
  check(types.join() === "image_edit.progress,image_edit.progress,image_edit.completed",
        `a stream reports each step, then the image (${types.join()})`);

  try {
    await client.images.edit({ image: await picture(), prompt: "x", mask: await picture() });
    check(false, "a mask is refused");
  } catch (error) {
    check(error instanceof OpenAI.BadRequestError, `a mask is refused with 400 (${error.status})`);
    check(error.param === "mask" && /^[0-9a-f]{16}$/.test(error.error.request_id),
          "the error names the field and the request id");
  }

  try {
    await new OpenAI({ apiKey: "wrong", baseURL, maxRetries: 0 }).models.list();
    check(false, "a wrong token is refused");
  } catch (error) {
    check(error instanceof OpenAI.AuthenticationError, `a wrong token gets 401 (${error.status})`);
  }
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === "dray-embedded", "models.list names the model");
}

main().catch((error) => {
  console.error(`FAIL: ${error.stack || error}`);
  process.exit(1);
});
