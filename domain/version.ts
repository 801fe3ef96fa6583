// The service's version, from package.json (npm_package_version is set only under npm scripts).
import fs from 'node:fs';

export const SERVICE_VERSION: string = JSON.parse(fs.readFileSync(new URL('../package.json', import.meta.url), 'utf8')).version;
